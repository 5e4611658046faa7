//! The examples' one line of timings.

/// Median, minimum and maximum of `t` (milliseconds).
pub fn stats(mut t: Vec<f64>) -> String {
    if t.is_empty() {
        return "nothing timed (give at least one change)".into();
    }
    t.sort_by(f64::total_cmp);
    format!(
        "median {:6.1} ms (min {:6.1}, max {:6.1})",
        t[t.len() / 2],
        t[0],
        t[t.len() - 1]
    )
}

/// Median, minimum and maximum of counts.
#[allow(dead_code)]
pub fn counts(mut c: Vec<u64>) -> String {
    if c.is_empty() {
        return "none counted".into();
    }
    c.sort_unstable();
    format!("median {} (min {}, max {})", c[c.len() / 2], c[0], c[c.len() - 1])
}
