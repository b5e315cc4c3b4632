//! The one way the workspace starts a replica process: a program and its arguments, stderr to a log
//! file, stdout read line by line — either until the first line names the metrics endpoint
//! (`metrics http://ADDR`, the example operator's start-up contract) or handed to a callback (the
//! benchmark's status lines). The process is killed when its [`ReplicaProcess`] is dropped, on a panic
//! too.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

pub use rustix::process::Signal as ProcessSignal;
use rustix::process::{kill_process, Pid, Signal};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// What went wrong starting or signalling a replica process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// The program could not be started.
    #[error("starting {name} ({program}): {source} (was the binary rebuilt meanwhile?)")]
    Spawn {
        name: String,
        program: PathBuf,
        source: std::io::Error,
    },
    /// The log file could not be created.
    #[error("{name}'s log {log}: {source}")]
    Log {
        name: String,
        log: PathBuf,
        source: std::io::Error,
    },
    /// The first stdout line was not `metrics http://ADDR` within the limit.
    #[error("{name} did not start within {within:?}: first line {first:?} (see {log})")]
    NotReady {
        name: String,
        within: Duration,
        first: Option<String>,
        log: PathBuf,
    },
    /// The process has exited (no pid to signal).
    #[error("{name} has exited")]
    Exited { name: String },
    /// A signal could not be delivered.
    #[error("signalling {name}: {source}")]
    Signal {
        name: String,
        source: std::io::Error,
    },
    /// It did not exit within the limit.
    #[error("{name} did not exit within {within:?}")]
    NoExit { name: String, within: Duration },
    /// Waiting for its exit failed.
    #[error("waiting for {name}: {source}")]
    Wait {
        name: String,
        source: std::io::Error,
    },
}

/// A command line for a replica process.
#[derive(Clone, Debug)]
pub struct Launch {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl Launch {
    /// Run `program`.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Launch {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// One more argument.
    #[must_use]
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    /// More arguments.
    #[must_use]
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable.
    #[must_use]
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.env
            .push((k.as_ref().to_owned(), v.as_ref().to_owned()));
        self
    }

    /// The program.
    pub fn program(&self) -> &Path {
        &self.program
    }
}

/// A running replica process.
#[derive(Debug)]
pub struct ReplicaProcess {
    name: String,
    child: Child,
    metrics: Option<String>,
    log: PathBuf,
}

impl ReplicaProcess {
    /// Start `launch` as `name`, stderr to `log`, and wait up to `within` for its first stdout line,
    /// `metrics http://ADDR`; the rest of its stdout is read and dropped.
    pub async fn start(
        name: &str,
        launch: &Launch,
        log: &Path,
        within: Duration,
    ) -> Result<ReplicaProcess, ProcessError> {
        let mut p = Self::spawn(name, launch, log)?;
        let stdout = p.child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(within, lines.next_line())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        match first
            .as_deref()
            .and_then(|l| l.strip_prefix("metrics http://"))
        {
            Some(addr) => p.metrics = Some(addr.to_owned()),
            None => {
                return Err(ProcessError::NotReady {
                    name: name.to_owned(),
                    within,
                    first,
                    log: log.to_owned(),
                })
            }
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(p)
    }

    /// Start `launch` as `name`, stderr to `log`, and hand each stdout line to `on_line` (without
    /// waiting for any).
    pub fn start_with_lines(
        name: &str,
        launch: &Launch,
        log: &Path,
        mut on_line: impl FnMut(&str) + Send + 'static,
    ) -> Result<ReplicaProcess, ProcessError> {
        let mut p = Self::spawn(name, launch, log)?;
        let stdout = p.child.stdout.take().expect("stdout is piped");
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                on_line(&line);
            }
        });
        Ok(p)
    }

    fn spawn(name: &str, launch: &Launch, log: &Path) -> Result<ReplicaProcess, ProcessError> {
        let file = std::fs::File::create(log).map_err(|source| ProcessError::Log {
            name: name.to_owned(),
            log: log.to_owned(),
            source,
        })?;
        let child = Command::new(&launch.program)
            .args(&launch.args)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                name: name.to_owned(),
                program: launch.program.clone(),
                source,
            })?;
        Ok(ReplicaProcess {
            name: name.to_owned(),
            child,
            metrics: None,
            log: log.to_owned(),
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ADDR` of its metrics endpoint (after [`start`](Self::start)).
    pub fn metrics_addr(&self) -> Option<&str> {
        self.metrics.as_deref()
    }

    /// Its pid while it runs (`None` once reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Send `signal` (TERM, STOP, CONT, ...); refused once the process has been reaped (its pid may
    /// belong to another process by then).
    pub fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        let exited = || ProcessError::Exited {
            name: self.name.clone(),
        };
        let pid = self.child.id().ok_or_else(exited)?;
        let pid = Pid::from_raw(pid as i32).ok_or_else(exited)?;
        kill_process(pid, signal).map_err(|e| ProcessError::Signal {
            name: self.name.clone(),
            source: e.into(),
        })
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM (the operator's graceful leave) and wait up to `within` for the exit.
    pub async fn terminate(&mut self, within: Duration) -> Result<ExitStatus, ProcessError> {
        self.signal(Signal::TERM)?;
        self.wait(within).await
    }

    /// Wait up to `within` for the exit.
    pub async fn wait(&mut self, within: Duration) -> Result<ExitStatus, ProcessError> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => Ok(status),
            Ok(Err(source)) => Err(ProcessError::Wait {
                name: self.name.clone(),
                source,
            }),
            Err(_) => Err(ProcessError::NoExit {
                name: self.name.clone(),
                within,
            }),
        }
    }
}
