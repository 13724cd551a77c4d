//! Kubernetes resource quantities (`940m`, `1392Mi`, `2`, `1.5Gi`, `128974848`, `129e6`) as
//! integers: CPU in millicores, everything else in base units (bytes, pods).

/// Parse a quantity into its value times `scale` (1000 for millicores, 1 for bytes), in exact
/// integer arithmetic, rounding up as the API server does for fractional millicores.
fn parse_scaled(q: &str, scale: i128) -> Option<i64> {
    let q = q.trim();
    let (negative, q) = match q.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, q.strip_prefix('+').unwrap_or(q)),
    };
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{int}{frac}");
    if digits.len() > 30 {
        return None;
    }
    let mantissa: i128 = digits.parse().ok()?;
    // value = mantissa * 10^-frac_len * multiplier * scale
    let (mut num, mut den): (i128, i128) = (mantissa.checked_mul(scale)?, 10i128.checked_pow(frac.len() as u32)?);
    let decimal = |e: i32, num: &mut i128, den: &mut i128| -> Option<()> {
        if e >= 0 {
            *num = num.checked_mul(10i128.checked_pow(e as u32)?)?;
        } else {
            *den = den.checked_mul(10i128.checked_pow((-e) as u32)?)?;
        }
        Some(())
    };
    match suffix {
        "" => {}
        "m" => decimal(-3, &mut num, &mut den)?,
        "k" => decimal(3, &mut num, &mut den)?,
        "M" => decimal(6, &mut num, &mut den)?,
        "G" => decimal(9, &mut num, &mut den)?,
        "T" => decimal(12, &mut num, &mut den)?,
        "P" => decimal(15, &mut num, &mut den)?,
        "E" => decimal(18, &mut num, &mut den)?,
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
            let power = match suffix { "Ki" => 1, "Mi" => 2, "Gi" => 3, "Ti" => 4, "Pi" => 5, _ => 6 };
            num = num.checked_mul(1024i128.checked_pow(power)?)?;
        }
        s if s.starts_with(['e', 'E']) => decimal(s[1..].parse::<i32>().ok().filter(|e| e.abs() <= 30)?, &mut num, &mut den)?,
        _ => return None,
    }
    let value = (num + den - 1) / den;
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// CPU in millicores.
pub fn cpu_millis(q: &str) -> Option<i64> {
    parse_scaled(q, 1000)
}

/// Memory (or any count) in base units.
pub fn value(q: &str) -> Option<i64> {
    parse_scaled(q, 1)
}

pub(crate) const MIB: i64 = 1024 * 1024;
pub(crate) const GIB: i64 = 1024 * MIB;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_forms() {
        assert_eq!(cpu_millis("940m"), Some(940));
        assert_eq!(cpu_millis("2"), Some(2000));
        assert_eq!(cpu_millis("1.5"), Some(1500));
        assert_eq!(cpu_millis("0.1"), Some(100));
        assert_eq!(value("1392Mi"), Some(1392 * MIB));
        assert_eq!(value("1.5Gi"), Some(GIB + GIB / 2));
        assert_eq!(value("128974848"), Some(128_974_848));
        assert_eq!(value("129e6"), Some(129_000_000));
        assert_eq!(value("1k"), Some(1000));
        assert_eq!(value("110"), Some(110));
        assert_eq!(value("12Qi"), None);
        assert_eq!(value(""), None);
        assert_eq!(value("abc"), None);
        assert_eq!(cpu_millis("0.0001"), Some(1), "fractional millicores round up");
        assert_eq!(value("99999999999999999999999Ei"), None, "overflow is an error, not a wrap");
    }
}
