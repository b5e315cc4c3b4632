mod dependent;
mod group;
mod model_common;
mod model_handoff;
mod model_takeover;
mod watcher;
mod realtime;
