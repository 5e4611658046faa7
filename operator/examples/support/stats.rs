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

/// The process's minor page faults so far (`/proc/self/stat`, field 10), where Linux tells them.
#[allow(dead_code)] // not every example counts them
pub fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split(' ').nth(7)?.parse().ok()
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
