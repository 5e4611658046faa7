//! How long the calling thread ran and waited to run, from the kernel's scheduler statistics
//! (`/proc/thread-self/schedstat`, Linux): a pass's wall time on a busy machine counts the time
//! other processes had the cores; its time on a core is what the pass itself cost. And the page
//! faults it took (`/proc/thread-self/stat`): memory the allocator gave back, touched again.

use std::time::Duration;

/// The calling thread's scheduler counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThreadRun {
    /// Time spent running on a core.
    pub on_cpu: Duration,
    /// Time spent runnable, waiting for a core.
    pub waiting: Duration,
    /// Page faults taken: minor (no disk) and major.
    pub faults: (u64, u64),
}

impl ThreadRun {
    /// The counters now; `None` where the kernel does not keep them (not Linux, or a kernel
    /// without scheduler statistics).
    pub fn now() -> Option<ThreadRun> {
        let mut run = parse(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)?;
        run.faults = faults(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)?;
        Some(run)
    }

    /// What the thread ran and waited since `earlier`.
    pub fn since(self, earlier: ThreadRun) -> ThreadRun {
        ThreadRun {
            on_cpu: self.on_cpu.saturating_sub(earlier.on_cpu),
            waiting: self.waiting.saturating_sub(earlier.waiting),
            faults: (
                self.faults.0.saturating_sub(earlier.faults.0),
                self.faults.1.saturating_sub(earlier.faults.1),
            ),
        }
    }
}

/// `schedstat`'s text: nanoseconds on a core, nanoseconds waiting on a run queue, time slices.
fn parse(text: &str) -> Option<ThreadRun> {
    let mut fields = text.split_ascii_whitespace().map(|f| f.parse::<u64>().ok());
    let on_cpu = fields.next()??;
    let waiting = fields.next()??;
    Some(ThreadRun {
        on_cpu: Duration::from_nanos(on_cpu),
        waiting: Duration::from_nanos(waiting),
        faults: (0, 0),
    })
}

/// `stat`'s minor and major fault counts (its 10th and 12th fields; the 2nd, the command's name
/// in parentheses, may hold spaces, so they are counted from its end).
fn faults(text: &str) -> Option<(u64, u64)> {
    let after_name = text.get(text.rfind(')')? + 1..)?;
    let fields: Vec<&str> = after_name.split_ascii_whitespace().collect();
    Some((fields.get(7)?.parse().ok()?, fields.get(9)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_fields() {
        let run = parse("933060 1500000 12\n").expect("three numbers");
        assert_eq!(run.on_cpu, Duration::from_nanos(933_060));
        assert_eq!(run.waiting, Duration::from_micros(1_500));
        assert_eq!(parse("garbage"), None);
        assert_eq!(parse(""), None);
        // A thread of a command whose name holds a space and a parenthesis.
        let stat = "4242 (tokio (rt) w) S 1 4242 4242 0 -1 4194560 1234 0 7 0 10 2 0 0 20 0 2 0 100";
        assert_eq!(faults(stat), Some((1234, 7)));
        assert_eq!(faults("4242 (x) S 1"), None);
    }

    /// A busy thread's time on a core grows as the kernel counts it (this test machine is
    /// Linux): within ten seconds of wall time it has run 10 ms, however loaded the machine.
    #[test]
    fn a_busy_thread_runs() {
        let Some(before) = ThreadRun::now() else {
            return;
        };
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let ran = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let ran = ThreadRun::now().expect("read once").since(before);
            if ran.on_cpu >= Duration::from_millis(10) || started.elapsed() > Duration::from_secs(10) {
                break ran;
            }
        };
        assert!(ran.on_cpu >= Duration::from_millis(10), "{ran:?}");
    }
}
