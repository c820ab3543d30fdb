//! Leader election through a coordination.k8s.io/v1 Lease.
//!
//! One replica holds the Lease and acts; the others poll it. The holder renews every
//! `renew` interval; if it cannot renew for `duration - renew` it stops acting (the process
//! exits) before anyone else may take over, and a standby takes over once `renewTime +
//! duration` has passed — within `duration + renew` (12 s with the defaults) of the leader
//! dying. Every Lease write is an optimistic update on resourceVersion, so two replicas
//! can never both win the same term.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::metrics::Health;

/// Lease parameters.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// Validity of a Lease without renewal.
    pub duration: Duration,
    /// Renewal / retry interval.
    pub renew: Duration,
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// Another replica took the Lease, or renewal failed for too long.
    #[error("lost the leader Lease {0}")]
    Lost(String),
}

/// Outcome of one attempt to take or keep the Lease.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Held,
    HeldByOther(String),
}

/// A Lease elector.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
}

impl LeaderElector {
    /// An elector for `settings`.
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        LeaderElector { api: Api::namespaced(client, &settings.namespace), settings }
    }

    /// Waits until this replica holds the Lease. Meanwhile `health` says whether this standby
    /// is ready: it is while its Lease checks succeed (it is connected, authenticated and
    /// allowed to take over), not while they fail.
    pub async fn acquire(&self, health: &Health) {
        let mut last_holder = String::new();
        let mut last_error = String::new();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    tracing::info!(identity = %self.settings.identity, lease = %self.settings.name, "became leader");
                    return;
                }
                Ok(Attempt::HeldByOther(holder)) => {
                    health.set_ready(true);
                    last_error.clear();
                    if holder != last_holder {
                        tracing::info!(holder = %holder, "waiting for the leader Lease");
                        last_holder = holder;
                    }
                }
                Err(e) => {
                    health.set_ready(false);
                    // Said once per distinct failure: a standby retries every `renew`.
                    let message = e.to_string();
                    if message != last_error {
                        tracing::warn!(
                            error = %message,
                            lease = %format!("{}/{}", self.settings.namespace, self.settings.name),
                            "cannot read or take the leader Lease; not ready until it works"
                        );
                        last_error = message;
                    }
                }
            }
            tokio::time::sleep(self.settings.renew).await;
        }
    }

    /// Renews the Lease until it is lost; returns why. Run it alongside the work and stop
    /// the work when it returns.
    pub async fn hold(&self) -> LeaderError {
        let deadline_slack = self.settings.duration.saturating_sub(self.settings.renew);
        let mut last_renewal = std::time::Instant::now();
        loop {
            tokio::time::sleep(self.settings.renew).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => last_renewal = std::time::Instant::now(),
                Ok(Attempt::HeldByOther(holder)) => return LeaderError::Lost(format!("(taken by {holder})")),
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the leader Lease");
                    if last_renewal.elapsed() >= deadline_slack {
                        return LeaderError::Lost("(renewal deadline passed)".into());
                    }
                }
            }
        }
    }

    /// Gives the Lease up (graceful shutdown), so a standby takes over at once.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.settings.name).await {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() == Some(self.settings.identity.as_str()) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                let _ = self.api.replace(&self.settings.name, &lease_write(), &lease).await;
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let me = self.settings.identity.clone();
        let duration_secs = i32::try_from(self.settings.duration.as_secs()).unwrap_or(15);
        match self.api.get_opt(&self.settings.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(me),
                        lease_duration_seconds: Some(duration_secs),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                match self.api.create(&lease_write(), &lease).await {
                    Ok(_) => Ok(Attempt::Held),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldByOther("(a racing replica)".into())),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                let holder = spec.holder_identity.clone().unwrap_or_default();
                if holder != me && !holder.is_empty() && !expired(spec, now) {
                    return Ok(Attempt::HeldByOther(holder));
                }
                if holder != me {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    spec.acquire_time = Some(MicroTime(now));
                    spec.holder_identity = Some(me);
                }
                spec.lease_duration_seconds = Some(duration_secs);
                spec.renew_time = Some(MicroTime(now));
                // resourceVersion in the body makes this a compare-and-swap.
                match self.api.replace(&self.settings.name, &lease_write(), &lease).await {
                    Ok(_) => Ok(Attempt::Held),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldByOther("(a racing replica)".into())),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// Whether a Lease's term has run out at `now`.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else { return true };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0));
    renewed.0 + SignedDuration::from_secs(secs) < now
}

/// Lease writes are recorded in managedFields under the controller's field manager.
fn lease_write() -> PostParams {
    PostParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_expiry() {
        let t0: Timestamp = "2024-01-01T00:00:00Z".parse().expect("ts");
        let spec = LeaseSpec { renew_time: Some(MicroTime(t0)), lease_duration_seconds: Some(10), ..Default::default() };
        assert!(!expired(&spec, t0 + SignedDuration::from_secs(9)));
        assert!(expired(&spec, t0 + SignedDuration::from_secs(11)));
        assert!(expired(&LeaseSpec::default(), t0));
    }
}
