//! Approval is an authorization, not just a patch (issue 26, item 5).
//!
//! Setting `provisioning.dev/approve` needs only `patch` on the object; what makes an
//! approval count is who set it. Under Manual approval the controller takes an annotation
//! into account only when:
//! - the API server recorded who set it: the server-owned `provisioning.dev/approved-by`
//!   (and `provisioning.dev/approved-by-groups`), which no field manager owns (clients cannot
//!   write it on the embedded API server; on an API server that does not stamp it, nothing is
//!   recorded, or a value some client wrote is owned by its field manager). An approval that
//!   cannot be attributed is refused: the safe default on a cluster without an admission
//!   webhook stamping the approver is that Manual plans wait;
//! - that user may `approve` the object (a virtual verb on `servers`, `taskservs`, `clusters`
//!   in group `provisioning.dev`, asked with a SubjectAccessReview for the user and its
//!   groups): deploy/rbac grants it to `admin`, not to `edit`;
//! - under the Workspace's `requireDistinctApprover`, that user is not the one who last
//!   changed the spec (`provisioning.dev/changed-by`; unknown counts as the same), nor a
//!   ServiceAccount of the object's namespace (whoever may edit it may act as those);
//! - or the approval was set by this controller itself (a Cluster passing its approval
//!   down), which checks the Cluster's approver against each member first ([`may_approve`]).
//!
//! A refused approval is as if the annotation were not there (the plan waits, a kept
//! approval no longer covers it), with one `ApprovalRefused` Warning naming what is missing.

use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};
use provisioning_crds::{ANNOTATION_APPROVE, Approval};
use serde::de::DeserializeOwned;

use super::{ANNOTATION_APPROVED_BY, ANNOTATION_CHANGED_BY, server_stamped};
use crate::context::Context;
use crate::error::Error;
use crate::reconcile::Note;

/// The server-owned annotation naming the groups of the user that set the approval (comma
/// separated), for the SubjectAccessReview of the approver.
pub const ANNOTATION_APPROVED_BY_GROUPS: &str = "provisioning.dev/approved-by-groups";
/// Event reason of an approval the controller does not take into account.
pub const APPROVAL_REFUSED: &str = "ApprovalRefused";
/// The virtual verb an approver needs on the object.
pub const VERB: &str = "approve";
const GROUP: &str = "provisioning.dev";
/// How another user re-approves the same plan id: the API server records the user of the
/// write that changes the annotation.
const AGAIN: &str = "to approve the same plan id as another user, remove the annotation and set it again";

/// The object an approval is about.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// Resource (plural) in `provisioning.dev`: servers, taskservs, clusters.
    pub plural: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
}

/// Who set the approval and who changed the spec, as the API server recorded them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The authenticated user that set `provisioning.dev/approve`.
    pub approver: Option<String>,
    /// Its groups.
    pub groups: Vec<String>,
    /// The authenticated user whose write made the current spec.
    pub changed_by: Option<String>,
    /// The objects the plan also reads (a TaskServ's `configFrom` ConfigMaps and Secrets), each
    /// with the user who last wrote its data, as the API server recorded it.
    pub sources: Vec<(String, Option<String>)>,
}

/// What the API server recorded on an object (its annotations and managedFields).
pub fn recorded(annotations: &std::collections::BTreeMap<String, String>, managed_fields: &[ManagedFieldsEntry]) -> Recorded {
    let approver = server_stamped(Some(annotations), managed_fields, ANNOTATION_APPROVED_BY);
    let groups = approver
        .as_ref()
        .and_then(|_| server_stamped(Some(annotations), managed_fields, ANNOTATION_APPROVED_BY_GROUPS))
        .map(|g| g.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_string).collect())
        .unwrap_or_default();
    Recorded { approver, groups, changed_by: server_stamped(Some(annotations), managed_fields, ANNOTATION_CHANGED_BY), sources: vec![] }
}

/// What is left to ask once the recorded facts are looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Set by this controller (a Cluster's approval passed down after [`may_approve`]).
    Controller,
    /// Ask whether this user (with these groups) may approve the target.
    Ask(String, Vec<String>),
}

/// The checks that need no API call: attributable, distinct approver; `controller` is this
/// controller's own user name. `Err` is the refusal's text.
pub fn precheck(rec: &Recorded, target: Target<'_>, distinct: bool, controller: Option<&str>) -> Result<Check, String> {
    let Target { plural, namespace, name } = target;
    let Some(user) = rec.approver.as_deref() else {
        return Err(format!(
            "the approval of {plural} {namespace}/{name} is refused: the API server did not record who set {ANNOTATION_APPROVE} \
             (the server-owned {ANNOTATION_APPROVED_BY}; the embedded API server records it, another one needs an admission \
             webhook that does), and a Manual approval counts only from a user who may {VERB} it"
        ));
    };
    if controller == Some(user) {
        return Ok(Check::Controller);
    }
    if distinct && rec.changed_by.as_deref().is_none_or(|c| c == user) {
        let who = match rec.changed_by.as_deref() {
            Some(_) => format!("user {user:?} last changed its spec and"),
            None => format!("the last writer of its spec is not recorded, so user {user:?}"),
        };
        return Err(format!(
            "the approval of {plural} {namespace}/{name} is refused: {who} may not also approve it (the Workspace sets \
             requireDistinctApprover): another user who may {VERB} {plural} must set {ANNOTATION_APPROVE} ({AGAIN})"
        ));
    }
    // A configFrom edit changes the plan as a spec edit does: its writer is not a second
    // person either (unknown counts as the same).
    if distinct && let Some((source, writer)) = rec.sources.iter().find(|(_, w)| w.as_deref().is_none_or(|w| w == user)) {
        let who = match writer {
            Some(_) => format!("user {user:?} last wrote the data of {source}, which the plan reads (configFrom), and"),
            None => format!("the last writer of {source}, which the plan reads (configFrom), is not recorded, so user {user:?}"),
        };
        return Err(format!(
            "the approval of {plural} {namespace}/{name} is refused: {who} may not also approve it (the Workspace sets \
             requireDistinctApprover): another user who may {VERB} {plural} must set {ANNOTATION_APPROVE} ({AGAIN})"
        ));
    }
    // Anyone who may edit a namespace may act as its ServiceAccounts (`create
    // serviceaccounts/token` is part of `edit`, as upstream's), so under four eyes a
    // ServiceAccount of the object's own namespace is not a second person.
    if distinct && user.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')).is_some_and(|(ns, _)| ns == namespace) {
        return Err(format!(
            "the approval of {plural} {namespace}/{name} is refused: {user:?} is a ServiceAccount of namespace {namespace}, and \
             whoever may edit that namespace may act as it (a token of it can be requested), so under the Workspace's \
             requireDistinctApprover it is not a second person: a user, or a ServiceAccount of another namespace, who may \
             {VERB} {plural} must set {ANNOTATION_APPROVE} ({AGAIN})"
        ));
    }
    Ok(Check::Ask(user.to_string(), rec.groups.clone()))
}

/// The refusal of a user the SubjectAccessReview did not allow.
pub fn not_allowed(user: &str, target: Target<'_>) -> String {
    let Target { plural, namespace, name } = target;
    format!(
        "the approval of {plural} {namespace}/{name} is refused: user {user:?} may not {VERB} {plural} in namespace {namespace}: \
         grant the {VERB} verb on {plural}.{GROUP} (the admin role aggregates it, edit does not), or have a user who holds it \
         set {ANNOTATION_APPROVE} ({AGAIN})"
    )
}

/// The refusal when the controller may not ask the API server about the approver.
pub fn cannot_ask(user: &str, target: Target<'_>) -> String {
    let Target { plural, namespace, name } = target;
    format!(
        "the approval of {plural} {namespace}/{name} is refused: the controller may not ask whether user {user:?} may {VERB} it \
         (grant the controller create on subjectaccessreviews.authorization.k8s.io, as deploy/rbac does)"
    )
}

/// Whether `user` (in `groups`) may approve `target`: a SubjectAccessReview.
pub async fn may_approve(ctx: &Context, user: &str, groups: &[String], target: Target<'_>) -> Result<bool, Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(VERB.into()),
                group: Some(GROUP.into()),
                resource: Some(target.plural.into()),
                namespace: Some(target.namespace.into()),
                name: Some(target.name.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(ctx.client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// This controller's own user name (a SelfSubjectReview, remembered once answered); `None`
/// when the API server does not answer it (then no approval counts as the controller's own).
pub async fn controller_user(ctx: &Context) -> Option<String> {
    if let Some(known) = ctx.identity.get() {
        return known.clone();
    }
    let api: Api<SelfSubjectReview> = Api::all(ctx.client.clone());
    match api.create(&PostParams::default(), &SelfSubjectReview::default()).await {
        Ok(r) => {
            let user = r.status.and_then(|s| s.user_info).and_then(|u| u.username);
            let _ = ctx.identity.set(user.clone());
            user
        }
        Err(e) => {
            // Not remembered: asked again next time (a failure may be passing).
            tracing::warn!(error = %e, "no SelfSubjectReview: approvals this controller passes down are checked like any other");
            None
        }
    }
}

/// Whether the approval on `target` (recorded as `rec`) counts: `Ok(Err(refusal))` when not.
pub async fn authorize(ctx: &Context, rec: &Recorded, target: Target<'_>, distinct: bool) -> Result<Result<(), String>, Error> {
    let controller = controller_user(ctx).await;
    match precheck(rec, target, distinct, controller.as_deref()) {
        Err(refusal) => Ok(Err(refusal)),
        Ok(Check::Controller) => Ok(Ok(())),
        Ok(Check::Ask(user, groups)) => match may_approve(ctx, &user, &groups, target).await {
            Ok(true) => Ok(Ok(())),
            Ok(false) => Ok(Err(not_allowed(&user, target))),
            // Not a passing failure: the controller may not ask. Refused, saying so, rather
            // than a reconcile failing for ever.
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 403 => Ok(Err(cannot_ask(&user, target))),
            Err(e) => Err(e),
        },
    }
}

/// The object as the approval gate is to see it: under Manual approval, an approval that
/// does not count ([`authorize`]) is taken off (in memory only), with the `ApprovalRefused`
/// Warning naming why. Reads the object's metadata afresh (the watch caches drop
/// managedFields, which tell a server-stamped approver from a client-written one).
pub async fn screen<K>(
    obj: Arc<K>,
    plural: &str,
    approval: Approval,
    distinct: bool,
    sources: &[(&str, &str)],
    ctx: &Context,
) -> Result<(Arc<K>, Option<Note>), Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let set = obj.annotations().get(ANNOTATION_APPROVE).is_some_and(|a| !a.trim().is_empty());
    if approval != Approval::Manual || !set {
        return Ok((obj, None));
    }
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    // Metadata decoded slim (crate::slim): the tenant can bloat managedFields.
    let api = crate::slim::SlimApi::of::<K>(ctx.client.clone(), Some(&namespace));
    let Some(fresh) = api.get_opt(&name).await?.map(|f| f.meta()) else { return Ok((obj, None)) };
    let mut rec = recorded(&fresh.annotations.unwrap_or_default(), fresh.managed_fields.as_deref().unwrap_or_default());
    if distinct {
        rec.sources = source_writers(ctx, &namespace, sources).await?;
    }
    let target = Target { plural, namespace: &namespace, name: &name };
    match authorize(ctx, &rec, target, distinct).await? {
        Ok(()) => Ok((obj, None)),
        Err(refusal) => {
            let mut stripped = (*obj).clone();
            stripped.annotations_mut().remove(ANNOTATION_APPROVE);
            Ok((Arc::new(stripped), Some(Note::warning(APPROVAL_REFUSED, "Approve", refusal))))
        }
    }
}

/// Who last wrote the data of each `(kind, name)` source (ConfigMap or Secret) of `namespace`,
/// as the API server recorded it; sources that do not exist are left out (the plan waits
/// for them anyway).
async fn source_writers(ctx: &Context, namespace: &str, sources: &[(&str, &str)]) -> Result<Vec<(String, Option<String>)>, Error> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let mut out = Vec::with_capacity(sources.len());
    for &(kind, name) in sources {
        // Metadata decoded slim (crate::slim): the tenant can bloat managedFields.
        let api = match kind {
            "Secret" => crate::slim::SlimApi::of::<Secret>(ctx.client.clone(), Some(namespace)),
            _ => crate::slim::SlimApi::of::<ConfigMap>(ctx.client.clone(), Some(namespace)),
        };
        let meta = api.get_opt(name).await?.map(|m| m.meta());
        if let Some(m) = meta {
            let writer = server_stamped(m.annotations.as_ref(), m.managed_fields.as_deref().unwrap_or_default(), ANNOTATION_CHANGED_BY);
            out.push((format!("{kind} {namespace}/{name}"), writer));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Target<'static> = Target { plural: "servers", namespace: "a", name: "web" };

    fn rec(approver: Option<&str>, changed_by: Option<&str>) -> Recorded {
        Recorded { approver: approver.map(Into::into), groups: vec!["g".into()], changed_by: changed_by.map(Into::into), sources: vec![] }
    }

    #[test]
    fn an_approval_counts_only_from_a_recorded_user_who_is_asked_about() {
        let unattributed = precheck(&rec(None, Some("bob")), T, false, Some("ctl")).expect_err("refused");
        assert!(unattributed.contains("did not record who set") && unattributed.contains("servers a/web"), "{unattributed}");
        assert_eq!(precheck(&rec(Some("alice"), Some("alice")), T, false, None), Ok(Check::Ask("alice".into(), vec!["g".into()])));
        assert_eq!(precheck(&rec(Some("ctl"), Some("ctl")), T, true, Some("ctl")), Ok(Check::Controller));
        let same = precheck(&rec(Some("alice"), Some("alice")), T, true, Some("ctl")).expect_err("distinct");
        assert!(same.contains("last changed its spec") && same.contains("requireDistinctApprover"), "{same}");
        assert!(precheck(&rec(Some("alice"), None), T, true, None).is_err(), "an unknown spec writer is not distinct");
        assert!(precheck(&rec(Some("alice"), Some("bob")), T, true, None).is_ok());
        // A ServiceAccount of the object's namespace is anyone's with edit there: not a second
        // person under requireDistinctApprover (one of another namespace may be).
        let own_sa = precheck(&rec(Some("system:serviceaccount:a:ci"), Some("bob")), T, true, None).expect_err("own SA");
        assert!(own_sa.contains("is a ServiceAccount of namespace a"), "{own_sa}");
        assert!(precheck(&rec(Some("system:serviceaccount:a:ci"), Some("bob")), T, false, None).is_ok(), "without four eyes it asks");
        assert!(precheck(&rec(Some("system:serviceaccount:ops:ci"), Some("bob")), T, true, None).is_ok());
        assert!(precheck(&rec(Some("system:serviceaccount:ab:ci"), Some("bob")), T, true, None).is_ok());
        // The writer of a configFrom source is not a second person either (unknown: the same).
        let mut with_sources = rec(Some("alice"), Some("bob"));
        with_sources.sources = vec![("ConfigMap a/cfg".into(), Some("carol".into()))];
        assert!(precheck(&with_sources, T, true, None).is_ok());
        with_sources.sources.push(("Secret a/pw".into(), Some("alice".into())));
        let own_source = precheck(&with_sources, T, true, None).expect_err("alice wrote the Secret");
        assert!(own_source.contains("last wrote the data of Secret a/pw"), "{own_source}");
        assert!(precheck(&with_sources, T, false, None).is_ok(), "only under four eyes");
        with_sources.sources = vec![("ConfigMap a/old".into(), None)];
        assert!(precheck(&with_sources, T, true, None).is_err_and(|e| e.contains("is not recorded")));
        let denied = not_allowed("alice", T);
        assert!(denied.contains("user \"alice\" may not approve servers in namespace a: grant the approve verb"), "{denied}");
    }

    #[test]
    fn recorded_facts_count_only_when_no_client_owns_them() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
        let annotations: std::collections::BTreeMap<String, String> = [
            (ANNOTATION_APPROVED_BY.to_string(), "alice".to_string()),
            (ANNOTATION_APPROVED_BY_GROUPS.to_string(), "team, system:authenticated".to_string()),
            (ANNOTATION_CHANGED_BY.to_string(), "bob".to_string()),
        ]
        .into();
        let r = recorded(&annotations, &[]);
        assert_eq!(
            r,
            Recorded {
                approver: Some("alice".into()),
                groups: vec!["team".into(), "system:authenticated".into()],
                changed_by: Some("bob".into()),
                sources: vec![]
            }
        );
        let forged = ManagedFieldsEntry {
            manager: Some("mallory".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:metadata": {"f:annotations": {"f:provisioning.dev/approved-by": {}}}}))),
            ..Default::default()
        };
        assert_eq!(recorded(&annotations, &[forged]).approver, None);
    }
}
