//! Numbers and counts as people read them, shared by every command's output and every message:
//! `1 node`, `3 nodes`, and money that never prints as `-0.0000`.

/// `n` and the noun, in the singular or the plural: `1 pod`, `0 pods`, `12 nodes` (every noun
/// Archer counts takes a plain `s`; `plural_of` gives the others).
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {}", plural_of(noun))
    }
}

fn plural_of(noun: &str) -> String {
    match noun {
        "replica" | "node" | "pod" => format!("{noun}s"),
        n if n.ends_with("ss") || n.ends_with("ch") || n.ends_with("sh") || n.ends_with('x') => format!("{n}es"),
        n if n.ends_with('y') && !n.ends_with("ay") && !n.ends_with("ey") && !n.ends_with("oy") => format!("{}ies", &n[..n.len() - 1]),
        n => format!("{n}s"),
    }
}

/// A price or a saving: zero is never negative (an empty sum of `f64` is `-0.0`, and a saving of
/// two equal totals can be `-0.0000…1`), and amounts that round to zero print as zero.
pub fn money(value: f64) -> f64 {
    if value.abs() < 5e-7 || value.is_nan() {
        0.0
    } else {
        value
    }
}

/// `$0.5136` (four decimals: the catalog's per-hour precision), never `$-0.0000`.
pub fn usd(value: f64) -> String {
    let v = money(value);
    let text = format!("{v:.4}");
    match text.strip_prefix('-') {
        _ if text.trim_start_matches('-').chars().all(|c| c == '0' || c == '.') => "$0.0000".to_string(),
        Some(magnitude) => format!("-${magnitude}"),
        None => format!("${text}"),
    }
}

/// Whole dollars (a month's figure): `$29`, never `$-0`.
pub fn usd_whole(value: f64) -> String {
    let text = format!("{:.0}", money(value));
    match text.strip_prefix('-') {
        Some("0") => "$0".to_string(),
        Some(magnitude) => format!("-${magnitude}"),
        None => format!("${text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_the_plural_except_for_one() {
        assert_eq!(count(0, "node"), "0 nodes");
        assert_eq!(count(1, "node"), "1 node");
        assert_eq!(count(2, "pod"), "2 pods");
        assert_eq!(count(3, "instance type"), "3 instance types");
        assert_eq!(count(2, "policy"), "2 policies");
        assert_eq!(count(2, "day"), "2 days");
        assert_eq!(count(2, "match"), "2 matches");
    }

    #[test]
    fn zero_is_never_negative() {
        let empty: f64 = std::iter::empty::<f64>().sum();
        assert!(empty.is_sign_negative(), "Rust's empty f64 sum is -0.0, the defect's source");
        assert_eq!(usd(empty), "$0.0000");
        assert_eq!(usd(-0.00001), "$0.0000");
        assert_eq!(usd(0.5136), "$0.5136");
        assert_eq!(usd(-0.25), "-$0.2500");
        assert_eq!(usd_whole(-0.2), "$0");
        assert_eq!(usd_whole(29.4), "$29");
        assert!(money(empty).is_sign_positive());
        assert_eq!(serde_json::to_string(&money(empty)).unwrap(), "0.0");
    }
}
