//! The settings made through the API before the first allocation (`set_mode`, `set_alignment`,
//! `set_limit`): they override the environment's, and once initialised only the values in
//! force are accepted.

use super::init::{INIT, STATE, caps, get};
use super::overrides::OVERRIDES;
use crate::config;
use crate::error::{Error, Result, Status};
use crate::mode::{Mode, ModeRequest};
use crate::prim::fork::{Held, lock};

/// Request a mode before the first allocation. Afterwards only the mode in force is accepted.
pub fn set_mode(req: ModeRequest) -> Result<()> {
    // Mode `host` needs no GPU: it is accepted without asking the machine.
    let caps = (req != ModeRequest::Forced(Mode::Host)).then(caps);
    if let Some(a) = get()
        && req != ModeRequest::Auto
    {
        // Resolved before INIT is held (it takes INIT itself).
        a.gpu();
    }
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        let mode = a.gpu.get().map(|g| g.mode);
        return match req {
            ModeRequest::Forced(m) if Some(m) == mode => Ok(()),
            ModeRequest::Auto if a.config.mode == ModeRequest::Auto => Ok(()),
            _ => Err(Error::new(
                Status::UMP_ERR_LOCKED,
                format!(
                    "the mode is already '{}' (fixed at the first allocation); it cannot change to '{}'",
                    mode.map_or("unset", Mode::name),
                    req.name()
                ),
            )),
        };
    }
    // Refuse a mode this machine cannot do now, not at the first allocation.
    if let Some(caps) = caps {
        caps.select(req)?;
    }
    lock(&OVERRIDES).mode = Some(req);
    Ok(())
}

/// Request an alignment before the first allocation. Afterwards only the one in force is
/// accepted.
pub fn set_alignment(n: usize) -> Result<()> {
    let n = config::check_alignment(n).map_err(|e| Error::config(format!("alignment {e}")))?;
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        if a.alignment == n {
            return Ok(());
        }
        return Err(Error::new(
            Status::UMP_ERR_LOCKED,
            format!(
                "the alignment is already {} (fixed at the first allocation); it cannot change to {n}",
                a.alignment
            ),
        ));
    }
    lock(&OVERRIDES).alignment = Some(n);
    Ok(())
}

/// Request a limit (`None`: no limit) before the first allocation. Afterwards only the one in
/// force is accepted.
pub fn set_limit(limit: Option<usize>) -> Result<()> {
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        if a.config.limit == limit {
            return Ok(());
        }
        let show = |l: Option<usize>| l.map_or("none".to_string(), |n| format!("{n} bytes"));
        return Err(Error::new(
            Status::UMP_ERR_LOCKED,
            format!(
                "the limit is already {} (fixed at the first allocation); it cannot change to {}",
                show(a.config.limit),
                show(limit)
            ),
        ));
    }
    lock(&OVERRIDES).limit = Some(limit);
    Ok(())
}

/// Fork: the initialisation lock and the settings made before it (first in the order, see
/// `crate::fork`).
pub(crate) fn fork_lock_settings(held: &mut Held) {
    held.push(lock(&INIT));
    held.push(lock(&OVERRIDES));
}
