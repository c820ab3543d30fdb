//! Per-client shares of the server: requests in flight and open watches are counted per
//! *flow*, as kube-apiserver's API Priority and Fairness does (simplified). The flow comes from
//! the identity that *authenticated* the request, before any impersonation: a ServiceAccount's
//! flow is its namespace (`serviceaccounts:<ns>`: whoever may create ServiceAccounts there can
//! mint tokens for any number of them, so they share one flow), any other user's flow is its
//! user name, and impersonating someone never moves a request to another flow. A flow runs
//! into its own cap (429 with `Retry-After`) and the others go on.
//!
//! The shared totals are shared fairly: once a total is at least half taken, a flow that
//! already holds its fair share of it (`total / (active flows + 1)`), or whose next place would
//! leave less free than a newcomer's share, is refused; a flow holding nothing is admitted
//! while anything is free. So a flow arriving later finds room however many greedy flows came
//! first (up to about as many flows as the total has places). Exempt identities (the `system:masters` group and the controller's ServiceAccount, as
//! APF's `exempt` priority level, judged by the authenticated identity too) are never refused
//! by these caps and do not use up the shared totals, so a tenant can never starve the
//! controller's own watches.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::auth::identity::UserInfo;

pub use crate::auth::identity::CONTROLLER_SERVICE_ACCOUNT;

/// What the caps are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityCaps {
    /// Requests in flight (not watches) of one flow at most.
    pub in_flight_per_user: usize,
    /// Requests in flight (not watches) of all non-exempt flows together at most.
    pub in_flight: usize,
    /// Open watches of one flow at most.
    pub watches_per_user: usize,
    /// Open watches of all non-exempt flows together at most.
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

/// Whose share a request uses: derived from the authenticated identity (before impersonation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Never refused, never counted.
    Exempt,
    /// Every ServiceAccount of this namespace.
    ServiceAccounts(String),
    /// A user that is not a ServiceAccount, by name.
    User(String),
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Flow::Exempt => f.write_str("exempt"),
            Flow::ServiceAccounts(ns) => write!(f, "serviceaccounts:{ns}"),
            Flow::User(name) => write!(f, "user {name}"),
        }
    }
}

/// Which of the two shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Requests in flight (not watches).
    InFlight,
    /// Open watches.
    Watches,
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Share::InFlight => "requests in flight",
            Share::Watches => "watches open",
        })
    }
}

/// Why a request was refused: the 429's message names the cap and the requester's own flow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The flow holds its own cap.
    #[error("too many {share} for this client's flow ({flow}) (limit {limit}); try again later")]
    Flow {
        /// Requests or watches.
        share: Share,
        /// The requester's flow (its own user name or namespace).
        flow: String,
        /// The per-flow cap.
        limit: usize,
    },
    /// All flows together hold the shared total.
    #[error("too many {share} on this server (limit {limit}); try again later")]
    Total {
        /// Requests or watches.
        share: Share,
        /// The shared total.
        limit: usize,
    },
    /// The shared total is at least half taken and the flow holds its fair share of it.
    #[error(
        "this client's flow ({flow}) holds its fair share of the {limit} {share} on this server ({held} held, {active} flows active); try again later"
    )]
    FairShare {
        /// Requests or watches.
        share: Share,
        /// The requester's flow.
        flow: String,
        /// The shared total.
        limit: usize,
        /// What the flow holds.
        held: usize,
        /// Flows holding some of this share.
        active: usize,
    },
}

#[derive(Default, Clone, Copy)]
struct Counts {
    in_flight: usize,
    watches: usize,
}

impl Counts {
    fn of(&mut self, share: Share) -> &mut usize {
        match share {
            Share::InFlight => &mut self.in_flight,
            Share::Watches => &mut self.watches,
        }
    }

    fn get(self, share: Share) -> usize {
        match share {
            Share::InFlight => self.in_flight,
            Share::Watches => self.watches,
        }
    }
}

#[derive(Default)]
struct Held {
    flows: HashMap<Flow, Counts>,
    total: Counts,
    /// Flows holding at least one request in flight / one watch.
    active: Counts,
}

/// The counters, shared by every connection.
pub struct IdentityLimits {
    caps: IdentityCaps,
    held: Mutex<Held>,
}

/// One admitted request's place, given back when dropped (a watch's when its stream ends).
pub struct Permit {
    limits: Arc<IdentityLimits>,
    /// None for an exempt flow (nothing was counted).
    flow: Option<Flow>,
    share: Share,
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

    /// The flow of a request `authenticated` made (the identity its credential proved, before
    /// any impersonation: impersonating never changes the flow, nor makes a request exempt).
    pub fn flow(&self, authenticated: &UserInfo) -> Flow {
        if self.is_exempt(authenticated) {
            Flow::Exempt
        } else if let Some(ns) = authenticated.service_account_namespace() {
            Flow::ServiceAccounts(ns.to_string())
        } else {
            Flow::User(authenticated.name.clone())
        }
    }

    fn refusal(&self, held: &Held, flow: &Flow, share: Share) -> Option<Refusal> {
        let (per_flow, limit) = match share {
            Share::InFlight => (self.caps.in_flight_per_user, self.caps.in_flight),
            Share::Watches => (self.caps.watches_per_user, self.caps.watches),
        };
        let mine = held.flows.get(flow).copied().unwrap_or_default().get(share);
        let total = held.total.get(share);
        let active = held.active.get(share);
        if mine >= per_flow {
            return Some(Refusal::Flow { share, flow: flow.to_string(), limit: per_flow });
        }
        if total >= limit {
            return Some(Refusal::Total { share, limit });
        }
        // Fair share, once half is taken: a flow holds at most limit / (active + 1), and does
        // not take the room a newcomer's share (limit / (active + 2)) needs; a flow holding
        // nothing yet is admitted while anything is free, so a newcomer always gets in.
        let half_taken = total.saturating_mul(2) >= limit;
        let fair = mine.saturating_mul(active + 1) >= limit || (mine > 0 && limit - total - 1 < limit / (active + 2));
        (half_taken && fair).then(|| Refusal::FairShare { share, flow: flow.to_string(), limit, held: mine, active })
    }

    /// A place for one request of `flow` (a watch or not), or why there is none.
    pub fn admit(self: &Arc<Self>, flow: &Flow, watch: bool) -> Result<Permit, Refusal> {
        let share = if watch { Share::Watches } else { Share::InFlight };
        if *flow == Flow::Exempt {
            return Ok(Permit { limits: self.clone(), flow: None, share });
        }
        let mut held = self.held();
        // Check and increment under one lock, so two requests cannot both take the last place.
        if let Some(r) = self.refusal(&held, flow, share) {
            return Err(r);
        }
        let held = &mut *held;
        *held.total.of(share) += 1;
        let mine = held.flows.entry(flow.clone()).or_default().of(share);
        *mine += 1;
        if *mine == 1 {
            *held.active.of(share) += 1;
        }
        Ok(Permit { limits: self.clone(), flow: Some(flow.clone()), share })
    }

    /// Requests in flight and watches `flow` holds now (for tests and diagnostics).
    pub fn held_by(&self, flow: &Flow) -> (usize, usize) {
        self.held().flows.get(flow).map(|c| (c.in_flight, c.watches)).unwrap_or_default()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(flow) = self.flow.take() else { return };
        let share = self.share;
        let mut guard = self.limits.held();
        let held = &mut *guard;
        let total = held.total.of(share);
        *total = total.saturating_sub(1);
        if let Some(c) = held.flows.get_mut(&flow) {
            let mine = c.of(share);
            if *mine > 0 {
                *mine -= 1;
                if *mine == 0 {
                    let active = held.active.of(share);
                    *active = active.saturating_sub(1);
                }
            }
            if c.in_flight == 0 && c.watches == 0 {
                // No entry kept for flows that hold nothing: the map stays as small as the
                // set of flows with requests open.
                held.flows.remove(&flow);
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

    /// The defaults of [`crate::Limits`] (400 in flight, 100 per flow; 10,000 watches, 500 per flow).
    fn default_caps() -> IdentityCaps {
        IdentityCaps::of(&crate::Limits::default())
    }

    fn user(name: &str) -> UserInfo {
        UserInfo { name: name.into(), uid: String::new(), groups: vec!["system:authenticated".into()], extra: BTreeMap::new() }
    }

    fn flow_of(l: &IdentityLimits, name: &str) -> Flow {
        l.flow(&user(name))
    }

    #[test]
    fn each_flow_has_its_share_and_exempt_users_are_never_refused() -> Result<(), Refusal> {
        let l = IdentityLimits::new(caps());
        let (a, b, c) = (flow_of(&l, "a"), flow_of(&l, "b"), flow_of(&l, "c"));
        let a1 = l.admit(&a, false)?;
        let _a2 = l.admit(&a, false)?;
        let refused = l.admit(&a, false).err();
        assert_eq!(refused, Some(Refusal::Flow { share: Share::InFlight, flow: "user a".into(), limit: 2 }));
        assert!(refused.is_some_and(|r| r.to_string().contains("too many requests in flight for this client's flow (user a) (limit 2)")));
        let _b1 = l.admit(&b, false)?;
        assert_eq!(l.admit(&c, false).err(), Some(Refusal::Total { share: Share::InFlight, limit: 3 }), "the shared total");
        // Exempt identities go on at every cap and count nowhere.
        let admin = l.flow(&UserInfo::admin());
        let controller = flow_of(&l, CONTROLLER_SERVICE_ACCOUNT);
        assert_eq!((&admin, &controller), (&Flow::Exempt, &Flow::Exempt));
        let held: Vec<Permit> =
            (0..10).map(|_| l.admit(&admin, false)).chain((0..10).map(|_| l.admit(&controller, true))).collect::<Result<_, _>>()?;
        assert_eq!(held.len(), 20);
        assert_eq!(l.held_by(&Flow::Exempt), (0, 0));
        // A place given back is free again.
        drop(a1);
        let _c1 = l.admit(&c, false)?;
        // Watches are counted apart from requests in flight.
        let _aw = l.admit(&a, true)?;
        assert!(matches!(l.admit(&a, true), Err(Refusal::Flow { share: Share::Watches, limit: 1, .. })));
        let bw = l.admit(&b, true)?;
        assert_eq!(l.admit(&c, true).err(), Some(Refusal::Total { share: Share::Watches, limit: 2 }));
        drop(bw);
        let _cw = l.admit(&c, true)?;
        assert_eq!(l.held_by(&b), (1, 0));
        Ok(())
    }

    #[test]
    fn flows_holding_nothing_leave_no_entry() -> Result<(), Refusal> {
        let l = IdentityLimits::new(caps());
        for i in 0..100 {
            drop(l.admit(&flow_of(&l, &format!("u{i}")), i % 2 == 0)?);
        }
        let held = l.held();
        assert!(held.flows.is_empty());
        assert_eq!((held.total.in_flight, held.total.watches), (0, 0));
        assert_eq!((held.active.in_flight, held.active.watches), (0, 0));
        Ok(())
    }

    #[test]
    fn the_service_accounts_of_a_namespace_are_one_flow() -> Result<(), Refusal> {
        let l = IdentityLimits::new(default_caps());
        // Tenant a mints tokens for 20 ServiceAccounts it created and holds slow requests and
        // watches with each: together they hold one flow's cap, not 20 of them.
        let mut held = vec![];
        let (mut requests, mut watches) = (0, 0);
        for i in 0..20 {
            let sa = UserInfo::service_account("tenant-a", &format!("minted-{i}"), "uid");
            let flow = l.flow(&sa);
            assert_eq!(flow, Flow::ServiceAccounts("tenant-a".into()));
            for watch in [false, true] {
                while let Ok(p) = l.admit(&flow, watch) {
                    if watch {
                        watches += 1
                    } else {
                        requests += 1
                    }
                    held.push(p);
                }
            }
        }
        assert_eq!((requests, watches), (100, 500), "one flow's caps");
        let refused = l.admit(&Flow::ServiceAccounts("tenant-a".into()), false).err();
        assert!(refused.is_some_and(|r| r.to_string().contains("(serviceaccounts:tenant-a) (limit 100)")));
        // Another namespace's ServiceAccounts and users are other flows and go on.
        let b = l.flow(&UserInfo::service_account("tenant-b", "app", "uid"));
        assert_eq!(b, Flow::ServiceAccounts("tenant-b".into()));
        held.push(l.admit(&b, false)?);
        held.push(l.admit(&b, true)?);
        held.push(l.admit(&flow_of(&l, "alice"), false)?);
        // A user whose name only looks like a ServiceAccount is a user.
        assert_eq!(flow_of(&l, "system:serviceaccount:nons"), Flow::User("system:serviceaccount:nons".into()));
        Ok(())
    }

    #[test]
    fn impersonation_keeps_the_impersonators_flow() {
        // The flow is taken from the authenticated identity; the impersonated one (here the
        // controller's ServiceAccount, which is exempt, or another tenant's) changes nothing.
        let l = IdentityLimits::new(default_caps());
        let tenant = UserInfo::service_account("tenant-a", "impersonator", "uid");
        assert_eq!(l.flow(&tenant), Flow::ServiceAccounts("tenant-a".into()));
        assert_eq!(l.flow(&UserInfo::admin()), Flow::Exempt, "system:masters impersonating someone stays exempt");
    }

    /// Flows `greedy` each take places until refused, one after the other; then a newcomer.
    fn greedy_then_newcomer(caps: IdentityCaps, greedy: usize, watch: bool) -> (Vec<usize>, usize) {
        let l = IdentityLimits::new(caps);
        let mut held = vec![];
        let mut took = vec![];
        for g in 0..greedy {
            let flow = Flow::User(format!("greedy-{g}"));
            let before = held.len();
            while let Ok(p) = l.admit(&flow, watch) {
                held.push(p);
            }
            took.push(held.len() - before);
        }
        let newcomer = Flow::User("newcomer".into());
        let mut got = 0;
        while let Ok(p) = l.admit(&newcomer, watch) {
            held.push(p);
            got += 1;
        }
        (took, got)
    }

    #[test]
    fn greedy_flows_leave_room_for_a_newcomer() {
        // Today's attack: 4 flows x 100 slow requests filled the 400 shared in flight, 20 x 500
        // watches the 10,000 shared watches. With up to 30 greedy flows before it (a tenant
        // has one flow per namespace it may create ServiceAccounts in, plus its user), a
        // newcomer still gets places. (Without preemption, enough flows of one place each fill
        // any total: at the defaults, about 38 greedy flows fill the 400 in flight.)
        for greedy in [1, 2, 4, 5, 8, 20, 30] {
            for watch in [false, true] {
                let (took, got) = greedy_then_newcomer(default_caps(), greedy, watch);
                assert!(got >= 1, "{greedy} greedy flows (watch {watch}) took {took:?} and left no room for a newcomer");
                let limit = if watch { 10_000 } else { 400 };
                assert!(took.iter().sum::<usize>() < limit, "{took:?}");
            }
        }
        // While few flows are active, the newcomer gets a real share, not a crumb.
        let (took, got) = greedy_then_newcomer(default_caps(), 4, false);
        assert_eq!(took[..2], [100, 100], "below half the total the per-flow cap is all there is");
        assert!(got >= 5, "{took:?} left {got}");
        let (_, got) = greedy_then_newcomer(default_caps(), 20, true);
        assert!(got >= 10, "20 greedy watchers left {got} watches");
        // The refusal names the fair share.
        let l = IdentityLimits::new(IdentityCaps { in_flight_per_user: 10, in_flight: 10, ..caps() });
        let flow = Flow::User("greedy".into());
        let held: Vec<Permit> = (0..5).map_while(|_| l.admit(&flow, false).ok()).collect();
        assert_eq!(held.len(), 5, "alone, a flow holds at most half the total");
        let refused = l.admit(&flow, false).err().map(|r| r.to_string()).unwrap_or_default();
        assert!(
            refused.contains("(user greedy) holds its fair share of the 10 requests in flight on this server (5 held, 1 flows active)"),
            "{refused}"
        );
    }
}
