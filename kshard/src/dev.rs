//! `kshard demo`, `kshard testserver` and `kshard bench` are the developer tool's (`kshard-dev`, not
//! installed with `kshard`: it links the embedded API server and the benchmark engine). When `kshard-dev`
//! sits beside this binary (a workspace build: `cargo build` builds both) these commands run it with the
//! same arguments (on Unix it replaces this process); otherwise they say where the command went.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// The arguments after the command, passed on unparsed.
#[derive(Debug, clap::Args)]
pub(crate) struct Forwarded {
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

/// Why a forwarded command did not run or did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error(
        "`kshard {command}` moved to the developer tool: run `cargo run -p kshard-dev -- {command} ...` \
         in the kube-shard repository (or put `kshard-dev` beside `kshard`)"
    )]
    Missing { command: &'static str },
    #[error("running {}: {source}", .program.display())]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    /// `kshard-dev` ran and failed; it has said why (only where it runs as a child: not on Unix).
    #[cfg_attr(unix, allow(dead_code))]
    #[error("kshard-dev {command} exited with {code}")]
    Exited { command: &'static str, code: u8 },
}

impl ForwardError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            ForwardError::Missing { .. } => 2,
            ForwardError::Spawn { .. } => 1,
            ForwardError::Exited { code, .. } => *code,
        }
    }
}

/// Run `kshard-dev COMMAND ARGS...` found beside this binary: on Unix in place of this process (the same
/// pid, so signals and the exit status are kshard-dev's), elsewhere as a child.
pub(crate) fn forward(command: &'static str, args: &Forwarded) -> Result<(), ForwardError> {
    let program = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(format!("kshard-dev{}", std::env::consts::EXE_SUFFIX)))
        .filter(|p| p.is_file())
        .ok_or(ForwardError::Missing { command })?;
    let mut cmd = Command::new(&program);
    cmd.arg(command).args(&args.args);
    run(cmd, command, program)
}

#[cfg(unix)]
fn run(mut cmd: Command, _command: &'static str, program: PathBuf) -> Result<(), ForwardError> {
    use std::os::unix::process::CommandExt;
    // returns only when the exec failed
    let source = cmd.exec();
    Err(ForwardError::Spawn { program, source })
}

#[cfg(not(unix))]
fn run(mut cmd: Command, command: &'static str, program: PathBuf) -> Result<(), ForwardError> {
    let status = cmd
        .status()
        .map_err(|source| ForwardError::Spawn { program, source })?;
    match status.code() {
        Some(0) => Ok(()),
        code => Err(ForwardError::Exited {
            command,
            code: code.and_then(|c| u8::try_from(c).ok()).unwrap_or(1),
        }),
    }
}
