//! In-process Kubernetes API server for tests (see issue [2/8]; not yet implemented).
#![forbid(unsafe_code)]
