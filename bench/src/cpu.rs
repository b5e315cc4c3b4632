//! CPU time over a phase: this process's (`/proc/self/stat`, user + system) and the whole machine's
//! (`/proc/stat`), so a table can say whether a phase was CPU-bound and how much of the box other
//! processes took meanwhile. Linux only; elsewhere every figure is 0.

use std::time::Instant;

/// `USER_HZ`: the unit of `/proc/stat` and `/proc/PID/stat` times (100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// A reading to measure a phase from.
#[derive(Clone, Copy, Debug)]
pub struct CpuClock {
    at: Instant,
    own: f64,
    busy: f64,
}

/// CPU used over a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CpuUse {
    /// Wall-clock seconds.
    pub wall: f64,
    /// CPU seconds of this process (every thread, user + system).
    pub own: f64,
    /// CPU seconds of every other process on the machine.
    pub others: f64,
}

impl CpuUse {
    /// Cores this process kept busy on average (CPU ÷ wall).
    #[must_use]
    pub fn own_cores(&self) -> f64 {
        crate::stats::ratio(self.own, self.wall)
    }

    /// Cores the other processes kept busy on average.
    #[must_use]
    pub fn other_cores(&self) -> f64 {
        crate::stats::ratio(self.others, self.wall)
    }
}

/// utime + stime of a `/proc/PID/stat` line, in seconds (fields 14 and 15, counted after the `)` that
/// ends the command name, which may hold spaces).
pub fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Busy CPU seconds of the whole machine from `/proc/stat`'s `cpu` line (all but idle and iowait).
pub fn machine_busy_seconds(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0.0);
    Some((total - idle) / USER_HZ)
}

/// Profiling hook: with `KSHARD_PERF_CTL` naming `perf record --control fifo:`'s control FIFO (started
/// with `-D -1`, disabled), `perf_control("enable")` / `perf_control("disable")` bracket a phase, so the
/// profile holds that phase alone. Without the variable it does nothing.
pub fn perf_control(command: &str) {
    let Some(path) = std::env::var_os("KSHARD_PERF_CTL") else {
        return;
    };
    // perf holds the FIFO open for reading for its whole run, so this write does not block
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{command}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!("KSHARD_PERF_CTL={}: {e}", path.to_string_lossy());
    }
}

fn read(path: &str, f: fn(&str) -> Option<f64>) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| f(&s))
        .unwrap_or(0.0)
}

impl CpuClock {
    /// Read the clocks now.
    #[must_use]
    pub fn now() -> Self {
        CpuClock {
            at: Instant::now(),
            own: read("/proc/self/stat", stat_cpu_seconds),
            busy: read("/proc/stat", machine_busy_seconds),
        }
    }

    /// What was used since this reading.
    #[must_use]
    pub fn since(&self) -> CpuUse {
        let now = CpuClock::now();
        let own = now.own - self.own;
        CpuUse {
            wall: (now.at - self.at).as_secs_f64(),
            own,
            others: (now.busy - self.busy - own).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields_are_read_after_the_command_name() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 3 0 1";
        assert_eq!(stat_cpu_seconds(stat), Some(3.0));
        let machine = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 50 0 50 350 50 0 0 0 0 0\n";
        assert_eq!(machine_busy_seconds(machine), Some(2.0));
    }

    #[test]
    fn a_busy_loop_shows_as_this_process_cpu() {
        // spin until 50 ms of CPU time are counted (however loaded the machine): a clock that does not
        // count this process's threads never gets there
        let c = CpuClock::now();
        let end = Instant::now() + std::time::Duration::from_secs(30);
        while c.since().own < 0.05 && Instant::now() < end {
            for _ in 0..10_000 {
                std::hint::spin_loop();
            }
        }
        let used = c.since();
        assert!(used.own >= 0.05 && used.wall > 0.0, "{used:?}");
    }
}
