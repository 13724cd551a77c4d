// `cargo run --release --manifest-path tools/lp-compare/Cargo.toml`: microlp against HiGHS, each
// with a 100 ms limit (the packer's integer-program budget). Requires cmake, g++ and libclang-dev.
// The master LP and the integer program of a column-generation packer, on a random instance
// shaped like Archer's (40 pod classes, N patterns), solved by microlp and by HiGHS.
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 { self.0 ^= self.0 >> 12; self.0 ^= self.0 << 25; self.0 ^= self.0 >> 27; self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) }
}

fn instance(items: usize, patterns: usize, seed: u64) -> (Vec<f64>, Vec<(f64, Vec<(usize, f64)>)>) {
    let mut r = Rng(seed);
    let demand: Vec<f64> = (0..items).map(|_| 20.0 + (r.next() % 40) as f64).collect();
    let mut cols = Vec::new();
    for _ in 0..patterns {
        let k = 1 + (r.next() % 4) as usize;
        let mut counts = Vec::new();
        let mut size = 0.0;
        for _ in 0..k {
            let i = (r.next() % items as u64) as usize;
            let c = 1.0 + (r.next() % 12) as f64;
            if !counts.iter().any(|(j, _)| *j == i) { counts.push((i, c)); size += c; }
        }
        let price = size * (0.9 + (r.next() % 300) as f64 / 1000.0);
        cols.push((price, counts));
    }
    for i in 0..items { cols.push((14.0, vec![(i, 1.0)])); }
    (demand, cols)
}

fn micro(demand: &[f64], cols: &[(f64, Vec<(usize, f64)>)], integer: bool) -> f64 {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    let mut p = Problem::new(OptimizationDirection::Minimize);
    p.set_time_limit(std::time::Duration::from_millis(100));
    let x: Vec<_> = cols.iter().map(|(price, _)| if integer { p.add_integer_var(*price, (0, 100)) } else { p.add_var(*price, (0.0, f64::INFINITY)) }).collect();
    for (i, d) in demand.iter().enumerate() {
        let row: Vec<_> = cols.iter().zip(&x).filter_map(|((_, c), v)| c.iter().find(|(j, _)| *j == i).map(|(_, k)| (*v, *k))).collect();
        p.add_constraint(row, ComparisonOp::Ge, *d);
    }
    match p.solve().unwrap() { microlp::SolveOutcome::Solution(s) => s.objective(), _ => f64::NAN }
}

fn highs_solve(demand: &[f64], cols: &[(f64, Vec<(usize, f64)>)], integer: bool) -> f64 {
    let mut p = highs::ColProblem::default();
    let rows: Vec<_> = demand.iter().map(|d| p.add_row(*d..)).collect();
    for (price, c) in cols {
        let f: Vec<_> = c.iter().map(|(i, k)| (rows[*i], *k)).collect();
        if integer { p.add_integer_column(*price, 0.0..=100.0, f); } else { p.add_column(*price, 0.., f); }
    }
    let mut m = p.optimise(highs::Sense::Minimise);
    m.set_option("time_limit", 0.1);
    m.set_option("output_flag", false);
    m.set_option("threads", 1);
    let s = m.solve();
    s.objective_value()
}

fn main() {
    for &n in &[500usize, 2_000, 5_000] {
        let (d, c) = instance(40, n, 7 + n as u64);
        for integer in [false, true] {
            let t = Instant::now(); let a = micro(&d, &c, integer); let ta = t.elapsed();
            let t = Instant::now(); let b = highs_solve(&d, &c, integer); let tb = t.elapsed();
            println!("{} patterns {}: microlp {:.3} in {:?}, HiGHS {:.3} in {:?}", n, if integer { "IP" } else { "LP" }, a, ta, b, tb);
        }
    }
}
