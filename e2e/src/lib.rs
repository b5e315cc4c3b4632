//! End-to-end suite for real clusters (see issue [8/8]; not yet implemented).
#![forbid(unsafe_code)]
