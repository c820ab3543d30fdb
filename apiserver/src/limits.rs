//! Per-identity shares of the server: requests in flight and open watches are counted per
//! authenticated user (after impersonation, as kube-apiserver's API Priority and Fairness
//! classifies them), so that one tenant — or a handful of its ServiceAccount tokens — runs into
//! its own cap (429 with `Retry-After`) and the others go on. Exempt identities (the
//! `system:masters` group and the controller's ServiceAccount, as APF's `exempt` priority
//! level) are never refused by these caps and do not use up the shared totals, so a tenant can
//! never starve the controller's own watches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::auth::identity::UserInfo;

pub use crate::auth::identity::CONTROLLER_SERVICE_ACCOUNT;

/// What the caps are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityCaps {
    /// Requests in flight (not watches) of one user at most.
    pub in_flight_per_user: usize,
    /// Requests in flight (not watches) of all non-exempt users together at most.
    pub in_flight: usize,
    /// Open watches of one user at most.
    pub watches_per_user: usize,
    /// Open watches of all non-exempt users together at most.
    pub watches: usize,
    /// Users never refused (by name).
    pub exempt_users: Vec<String>,
    /// Groups whose members are never refused.
    pub exempt_groups: Vec<String>,
}

impl IdentityCaps {
    /// The caps of the server's [`crate::Limits`].
    pub fn of(limits: &crate::Limits) -> IdentityCaps {
        IdentityCaps {
            in_flight_per_user: limits.max_requests_in_flight_per_user,
            in_flight: limits.max_requests_in_flight,
            watches_per_user: limits.max_watches_per_user,
            watches: limits.max_watches,
            exempt_users: limits.exempt_users.clone(),
            exempt_groups: limits.exempt_groups.clone(),
        }
    }
}

/// Why a request was refused: the 429's message names the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The user holds its share of requests in flight.
    #[error("too many requests in flight for this user (limit {0}); try again later")]
    UserInFlight(usize),
    /// All users together hold the shared requests in flight.
    #[error("too many requests in flight on this server (limit {0}); try again later")]
    InFlight(usize),
    /// The user holds its share of watches.
    #[error("too many watches open for this user (limit {0}); close some or try again later")]
    UserWatches(usize),
    /// All users together hold the shared watches.
    #[error("too many watches open on this server (limit {0}); try again later")]
    Watches(usize),
}

#[derive(Default, Clone, Copy)]
struct Counts {
    in_flight: usize,
    watches: usize,
}

#[derive(Default)]
struct Held {
    users: HashMap<String, Counts>,
    total: Counts,
}

/// The counters, shared by every connection.
pub struct IdentityLimits {
    caps: IdentityCaps,
    held: Mutex<Held>,
}

/// One admitted request's place, given back when dropped (a watch's when its stream ends).
pub struct Permit {
    limits: Arc<IdentityLimits>,
    /// None for an exempt user (nothing was counted).
    user: Option<String>,
    watch: bool,
}

impl IdentityLimits {
    /// Counters for `caps`.
    pub fn new(caps: IdentityCaps) -> Arc<IdentityLimits> {
        Arc::new(IdentityLimits { caps, held: Mutex::new(Held::default()) })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Plain counters: a panic elsewhere while holding them leaves them usable.
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `user` is never refused.
    pub fn is_exempt(&self, user: &UserInfo) -> bool {
        self.caps.exempt_users.contains(&user.name) || user.groups.iter().any(|g| self.caps.exempt_groups.contains(g))
    }

    /// A place for one request of `user` (a watch or not), or why there is none.
    pub fn admit(self: &Arc<Self>, user: &UserInfo, watch: bool) -> Result<Permit, Refusal> {
        if self.is_exempt(user) {
            return Ok(Permit { limits: self.clone(), user: None, watch });
        }
        let caps = &self.caps;
        let mut held = self.held();
        let mine = held.users.get(&user.name).copied().unwrap_or_default();
        // Check and increment under one lock, so two requests cannot both take the last place.
        let refused = if watch {
            if mine.watches >= caps.watches_per_user {
                Some(Refusal::UserWatches(caps.watches_per_user))
            } else if held.total.watches >= caps.watches {
                Some(Refusal::Watches(caps.watches))
            } else {
                None
            }
        } else if mine.in_flight >= caps.in_flight_per_user {
            Some(Refusal::UserInFlight(caps.in_flight_per_user))
        } else if held.total.in_flight >= caps.in_flight {
            Some(Refusal::InFlight(caps.in_flight))
        } else {
            None
        };
        if let Some(r) = refused {
            return Err(r);
        }
        let count = |c: &mut Counts| {
            if watch {
                c.watches += 1;
            } else {
                c.in_flight += 1;
            }
        };
        count(&mut held.total);
        count(held.users.entry(user.name.clone()).or_default());
        Ok(Permit { limits: self.clone(), user: Some(user.name.clone()), watch })
    }

    /// Requests in flight and watches `user` holds now (for tests and diagnostics).
    pub fn held_by(&self, user: &str) -> (usize, usize) {
        self.held().users.get(user).map(|c| (c.in_flight, c.watches)).unwrap_or_default()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(user) = self.user.take() else { return };
        let mut held = self.limits.held();
        let watch = self.watch;
        let release = |c: &mut Counts| {
            if watch {
                c.watches = c.watches.saturating_sub(1);
            } else {
                c.in_flight = c.in_flight.saturating_sub(1);
            }
        };
        release(&mut held.total);
        if let Some(c) = held.users.get_mut(&user) {
            release(c);
            if c.in_flight == 0 && c.watches == 0 {
                // No entry kept for users that hold nothing: the map stays as small as the
                // set of users with requests open.
                held.users.remove(&user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::auth::identity::MASTERS;

    fn caps() -> IdentityCaps {
        IdentityCaps {
            in_flight_per_user: 2,
            in_flight: 3,
            watches_per_user: 1,
            watches: 2,
            exempt_users: vec![CONTROLLER_SERVICE_ACCOUNT.into()],
            exempt_groups: vec![MASTERS.into()],
        }
    }

    fn user(name: &str) -> UserInfo {
        UserInfo { name: name.into(), uid: String::new(), groups: vec!["system:authenticated".into()], extra: BTreeMap::new() }
    }

    #[test]
    fn each_user_has_its_share_and_exempt_users_are_never_refused() -> Result<(), Refusal> {
        let l = IdentityLimits::new(caps());
        let (a, b, c) = (user("a"), user("b"), user("c"));
        let a1 = l.admit(&a, false)?;
        let _a2 = l.admit(&a, false)?;
        assert_eq!(l.admit(&a, false).err(), Some(Refusal::UserInFlight(2)));
        let _b1 = l.admit(&b, false)?;
        assert_eq!(l.admit(&c, false).err(), Some(Refusal::InFlight(3)), "the shared total");
        // Exempt identities go on at every cap and count nowhere.
        let admin = UserInfo::admin();
        let controller = user(CONTROLLER_SERVICE_ACCOUNT);
        let held: Vec<Permit> =
            (0..10).map(|_| l.admit(&admin, false)).chain((0..10).map(|_| l.admit(&controller, true))).collect::<Result<_, _>>()?;
        assert_eq!(held.len(), 20);
        assert_eq!(l.held_by(&admin.name), (0, 0));
        // A place given back is free again.
        drop(a1);
        let _c1 = l.admit(&c, false)?;
        // Watches are counted apart from requests in flight.
        let _aw = l.admit(&a, true)?;
        assert_eq!(l.admit(&a, true).err(), Some(Refusal::UserWatches(1)));
        let bw = l.admit(&b, true)?;
        assert_eq!(l.admit(&c, true).err(), Some(Refusal::Watches(2)));
        drop(bw);
        let _cw = l.admit(&c, true)?;
        assert_eq!(l.held_by("b"), (1, 0));
        Ok(())
    }

    #[test]
    fn users_holding_nothing_leave_no_entry() -> Result<(), Refusal> {
        let l = IdentityLimits::new(caps());
        for i in 0..100 {
            drop(l.admit(&user(&format!("u{i}")), i % 2 == 0)?);
        }
        let held = l.held();
        assert!(held.users.is_empty());
        assert_eq!((held.total.in_flight, held.total.watches), (0, 0));
        Ok(())
    }
}
