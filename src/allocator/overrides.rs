//! The settings made through the API before the first allocation, as they wait for it: what
//! `set_mode`, `set_alignment` and `set_limit` (`settings.rs`) stored, and the configuration
//! with them in force, which start-up (`init.rs`) reads.

use crate::config::Config;
use crate::mode::ModeRequest;
use crate::prim::fork::lock;
use std::sync::Mutex;

/// Settings made through the API before initialisation; they override the environment.
#[derive(Default)]
pub(super) struct Overrides {
    pub(super) mode: Option<ModeRequest>,
    pub(super) alignment: Option<usize>,
    /// `Some(None)`: no limit, whatever the environment says.
    pub(super) limit: Option<Option<usize>>,
}

pub(super) static OVERRIDES: Mutex<Overrides> = Mutex::new(Overrides {
    mode: None,
    alignment: None,
    limit: None,
});

/// `config` with the settings made through the API (`set_mode` and the like) in force.
pub(super) fn with_overrides(mut config: Config) -> Config {
    let o = lock(&OVERRIDES);
    if let Some(m) = o.mode {
        config.mode = m;
    }
    if let Some(a) = o.alignment {
        config.alignment = a;
    }
    if let Some(l) = o.limit {
        config.limit = l;
    }
    config
}
