//! The report as text: a summary, a table of workloads, what blocks arm64, misplaced pods.

use std::fmt::Write;

use super::{Readiness, Report};

fn dollars(v: f64) -> String {
    format!("${v:.2}")
}

fn readiness(r: Readiness) -> &'static str {
    match r {
        Readiness::OnArm64 => "on arm64",
        Readiness::Movable => "movable",
        Readiness::Pinned => "pinned off arm64",
        Readiness::Blocked => "blocked",
        Readiness::Unknown => "unknown",
    }
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len)).map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

pub fn render_text(r: &Report) -> String {
    let s = &r.summary;
    let mut out = String::new();
    let archs: Vec<String> = s.nodes_by_arch.iter().map(|(a, n)| format!("{a} {n}")).collect();
    let share = if s.cost_per_month > 0.0 { 100.0 * s.arm64_cost_per_month / s.cost_per_month } else { 0.0 };
    let unpriced = match s.unpriced_nodes {
        0 => String::new(),
        1 => "; 1 node unpriced, not counted".to_string(),
        n => format!("; {n} nodes unpriced, not counted"),
    };
    let _ = writeln!(out, "Cluster: {} nodes ({}), {} pods, {}/month ({} on arm64, {share:.0}%{unpriced})", s.nodes, archs.join(", "), s.pods, dollars(s.cost_per_month), dollars(s.arm64_cost_per_month));
    let _ = writeln!(out, "Workloads: {}; movable to arm64: {} (saving {}/month); blocked by single-arch images: {}; unknown: {}", s.workloads, s.movable, dollars(s.saving_per_month), s.blocked, s.unknown);
    let _ = writeln!(out, "Pods on an architecture their images do not support: {}", s.misplaced_pods);
    if s.undecided_pods > 0 {
        let why: Vec<String> = s.undecided_by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ = writeln!(out, "Pods Archer could not decide (their images could not be inspected): {} ({})", s.undecided_pods, why.join(", "));
    }
    let mut rows = vec![["NAMESPACE", "KIND", "NAME", "PODS", "ARCH", "COST/MONTH", "ARM64", "SAVING/MONTH"].iter().map(|c| c.to_string()).collect::<Vec<_>>()];
    for w in &r.workloads {
        let arch: Vec<String> = w.architectures.iter().map(|(a, n)| format!("{a}:{n}")).collect();
        rows.push(vec![w.namespace.clone(), w.kind.clone(), w.name.clone(), w.pods.to_string(), arch.join(","), dollars(w.cost_per_month), readiness(w.readiness).into(), w.saving_per_month.map(dollars).unwrap_or_else(|| "-".into())]);
    }
    let _ = write!(out, "\n{}", table(&rows));
    let blocked: Vec<_> = r.workloads.iter().filter(|w| !w.blocked_by.is_empty()).collect();
    if !blocked.is_empty() {
        let _ = writeln!(out, "\nBlocked from arm64 (or not inspectable):");
        for w in blocked {
            for b in &w.blocked_by {
                let why = match &b.error {
                    Some(e) => format!("could not be inspected: {e}"),
                    None => format!("built only for {}", b.platforms.join(", ")),
                };
                let _ = writeln!(out, "  {}/{} {}: {} {why}", w.namespace, w.kind, w.name, b.image);
            }
        }
    }
    if !r.misplaced.is_empty() {
        let _ = writeln!(out, "\nPods on an architecture their images do not support:");
        for m in &r.misplaced {
            let _ = writeln!(out, "  {} on {} ({}): its images run on {}", m.pod, m.node, m.arch, m.supported.join(", "));
        }
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
