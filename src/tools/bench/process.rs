//! The measured proxies run as processes of their own, so that their CPU
//! time (user + system, from `/proc`) is theirs alone and not the
//! benchmark driver's.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `laconic serve` started for the duration of a benchmark.
pub struct Laconic {
    pub addr: String,
    child: Child,
    _config: TempFile,
}

impl Laconic {
    /// Starts `laconic serve` (this same binary) with `config` (TOML) in
    /// front of `upstream`; returns once it listens.
    pub fn start(upstream: &str, config: &str) -> crate::tools::Result<Laconic> {
        Laconic::start_from(&std::env::current_exe()?, upstream, config)
    }

    /// [`Laconic::start`] of another build, `binary`.
    pub fn start_from(
        binary: &Path,
        upstream: &str,
        config: &str,
    ) -> crate::tools::Result<Laconic> {
        let file = TempFile::new("toml", config)?;
        let mut child = Command::new(binary)
            .args(["serve", "--listen", "127.0.0.1:0", "--upstream", upstream])
            .arg("--config")
            .arg(&file.0)
            .env("LACONIC_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            crate::tools::bail!("laconic serve did not start: {line:?}");
        };
        Ok(Laconic {
            addr: addr.to_owned(),
            child,
            _config: file,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Laconic {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User + system CPU time a process has used so far, all its threads
/// included: the scheduler's count of the time each thread ran, in
/// nanoseconds (`/proc/PID/task/TID/schedstat`). The user and system times
/// of `/proc/PID/stat` are the same time counted in clock ticks: over one
/// round of a benchmark (a second, less than a second of CPU) a reading
/// is off by up to a tick, several per cent. They are the fallback where
/// the kernel keeps no schedstat. (A thread that ends between two readings
/// would take its time out of the sum; the processes measured, haproxy and
/// Laconic without compression, keep their threads.)
pub fn cpu_time(pid: u32) -> Option<Duration> {
    thread_runtime(pid).or_else(|| {
        let (user, system) = cpu_ticks(pid)?;
        Some(Duration::from_secs_f64(
            (user + system) as f64 / clock_ticks(),
        ))
    })
}

/// The user and the system time a process has used so far, in clock
/// ticks (`/proc/PID/stat`): coarse, but over a case of a benchmark (some
/// hundreds of ticks) they say which side of the system call boundary a
/// proxy's CPU time is spent on.
pub fn cpu_ticks(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

/// The sum of the run times of a process's threads, from their schedstat.
fn thread_runtime(pid: u32) -> Option<Duration> {
    std::fs::metadata(format!("/proc/{pid}/schedstat")).ok()?;
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread that ended since the listing has nothing to read.
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            nanos += parse_runtime(&stat)?;
        }
    }
    Some(Duration::from_nanos(nanos))
}

/// The first field of a schedstat: nanoseconds on the CPU.
fn parse_runtime(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// utime and stime, in clock ticks, from the text of `/proc/PID/stat`.
/// The command name (field 2) may hold spaces and parentheses, so fields
/// are counted from the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // field 3 is the first here
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// A file removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(ext: &str, text: &str) -> std::io::Result<TempFile> {
        let path = std::env::temp_dir().join(format!(
            "laconic-bench-{}-{}.{ext}",
            std::process::id(),
            crate::random::u64()
        ));
        std::fs::write(&path, text)?;
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_fields_14_and_15_even_with_a_strange_command_name() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 9 0 1 2 3";
        assert_eq!(parse_cpu_ticks(stat), Some((37, 5)));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    /// Spends CPU time on this thread.
    fn burn(steps: u64) {
        let mut x = 0u64;
        for i in 0..steps {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
    }

    #[test]
    fn a_threads_run_time_is_the_first_field_of_its_schedstat() {
        assert_eq!(parse_runtime("123456789 5000 42\n"), Some(123_456_789));
        assert_eq!(parse_runtime(""), None);
        assert_eq!(parse_runtime("x 1 2"), None);
    }

    /// Both counts of a thread's time agree, to a few ticks: the precise
    /// one is the same time as the one in ticks. (This test's own thread:
    /// the process's other threads come and go with the other tests.)
    #[test]
    fn a_threads_run_time_is_its_cpu_time() {
        burn(50_000_000);
        let Ok(schedstat) = std::fs::read_to_string("/proc/thread-self/schedstat") else {
            return; // a kernel without schedstat: `cpu_time` falls back
        };
        let precise = parse_runtime(&schedstat).unwrap() as f64 / 1e9;
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let (user, system) = parse_cpu_ticks(&stat).unwrap();
        let ticks = (user + system) as f64 / clock_ticks();
        assert!(precise > 0.0);
        assert!(
            (precise - ticks).abs() < 0.05 + ticks * 0.1,
            "schedstat {precise} s against {ticks} s in ticks"
        );
        let process = thread_runtime(std::process::id()).unwrap();
        assert!(process.as_secs_f64() >= precise);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        burn(20_000_000);
        assert!(cpu_time(std::process::id()).is_some_and(|t| t > Duration::ZERO));
    }
}
