mod dependent;
mod fenced;
mod group;
mod model_common;
mod model_handoff;
mod model_takeover;
mod realtime;
mod watcher;
