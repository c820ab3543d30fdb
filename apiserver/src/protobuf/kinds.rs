//! Our own table of the protobuf messages kubectl's typed commands send, and the decoder that
//! walks it. Each message is a list of (field number, JSON name, type); the field numbers are
//! wire facts of k8s.io/api (apps/v1, batch/v1, core/v1, rbac/v1, policy/v1) and
//! k8s.io/apimachinery (meta/v1, intstr, resource). A field number a message does not list is
//! refused with 415 naming the message and the field: nothing is silently dropped.
//!
//! Go's generated marshallers write every non-pointer field, zero or not; the JSON encoder
//! omits the `omitempty` ones. [`T::Str`], [`T::Int0`] and [`T::Bool0`] drop zero values so
//! the decoded object is the JSON kubectl would have sent; [`T::Int`] and [`T::Bool`] (pointers
//! and required numbers) keep them.

use base64::Engine;
use chrono::{DateTime, SecondsFormat};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::wire::{Field, bad, fields, text};

/// One message: its upstream name (for errors) and its fields.
pub struct Msg {
    name: &'static str,
    fields: &'static [(u64, &'static str, T)],
}

/// How one field turns into JSON.
pub enum T {
    /// string, omitted when empty (Go `omitempty`)
    Str,
    /// repeated string
    Strs,
    /// int32/int64 kept at zero (pointer or required field)
    Int,
    /// int32/int64 omitted at zero
    Int0,
    /// bool kept when false (pointer field)
    Bool,
    /// bool omitted when false
    Bool0,
    /// embedded message
    M(&'static Msg),
    /// repeated message
    Ms(&'static Msg),
    /// embedded Go struct whose fields JSON inlines into the parent
    Inline(&'static Msg),
    /// map<string, string>
    StrMap,
    /// map<string, bytes> (base64 in JSON)
    BytesMap,
    /// map<string, Quantity>
    QtyMap,
    /// meta/v1 Time (seconds = 1, nanos = 2) as RFC 3339, omitted when zero
    Time,
    /// resource.Quantity (string = 1)
    Qty,
    /// intstr.IntOrString (type = 1, intVal = 2, strVal = 3)
    IntOrStr,
    /// meta/v1 FieldsV1 (raw = 1, JSON text)
    FieldsV1,
    /// a status the server writes: accepted only when every field is zero or empty
    Status,
}

macro_rules! msg {
    ($id:ident, $name:literal, [$(($n:literal, $json:literal, $t:expr)),* $(,)?]) => {
        pub static $id: Msg = Msg { name: $name, fields: &[$(($n, $json, $t)),*] };
    };
}

// meta/v1
msg!(
    OWNER_REF,
    "OwnerReference",
    [
        (1, "kind", T::Str),
        (3, "name", T::Str),
        (4, "uid", T::Str),
        (5, "apiVersion", T::Str),
        (6, "controller", T::Bool),
        (7, "blockOwnerDeletion", T::Bool)
    ]
);
msg!(
    MANAGED_FIELDS,
    "ManagedFieldsEntry",
    [
        (1, "manager", T::Str),
        (2, "operation", T::Str),
        (3, "apiVersion", T::Str),
        (4, "time", T::Time),
        (6, "fieldsType", T::Str),
        (7, "fieldsV1", T::FieldsV1),
        (8, "subresource", T::Str)
    ]
);
msg!(
    META,
    "ObjectMeta",
    [
        (1, "name", T::Str),
        (2, "generateName", T::Str),
        (3, "namespace", T::Str),
        (4, "selfLink", T::Str),
        (5, "uid", T::Str),
        (6, "resourceVersion", T::Str),
        (7, "generation", T::Int0),
        (8, "creationTimestamp", T::Time),
        (9, "deletionTimestamp", T::Time),
        (10, "deletionGracePeriodSeconds", T::Int),
        (11, "labels", T::StrMap),
        (12, "annotations", T::StrMap),
        (13, "ownerReferences", T::Ms(&OWNER_REF)),
        (14, "finalizers", T::Strs),
        (17, "managedFields", T::Ms(&MANAGED_FIELDS))
    ]
);
msg!(SELECTOR_REQ, "LabelSelectorRequirement", [(1, "key", T::Str), (2, "operator", T::Str), (3, "values", T::Strs)]);
msg!(SELECTOR, "LabelSelector", [(1, "matchLabels", T::StrMap), (2, "matchExpressions", T::Ms(&SELECTOR_REQ))]);

// core/v1: pod templates
msg!(LOCAL_REF, "LocalObjectReference", [(1, "name", T::Str)]);
msg!(FIELD_SEL, "ObjectFieldSelector", [(1, "apiVersion", T::Str), (2, "fieldPath", T::Str)]);
msg!(RESOURCE_SEL, "ResourceFieldSelector", [(1, "containerName", T::Str), (2, "resource", T::Str), (3, "divisor", T::Qty)]);
msg!(KEY_SEL, "KeySelector", [(1, "", T::Inline(&LOCAL_REF)), (2, "key", T::Str), (3, "optional", T::Bool)]);
msg!(
    ENV_SOURCE,
    "EnvVarSource",
    [
        (1, "fieldRef", T::M(&FIELD_SEL)),
        (2, "resourceFieldRef", T::M(&RESOURCE_SEL)),
        (3, "configMapKeyRef", T::M(&KEY_SEL)),
        (4, "secretKeyRef", T::M(&KEY_SEL))
    ]
);
msg!(ENV, "EnvVar", [(1, "name", T::Str), (2, "value", T::Str), (3, "valueFrom", T::M(&ENV_SOURCE))]);
msg!(ENV_FROM_REF, "EnvFromReference", [(1, "", T::Inline(&LOCAL_REF)), (2, "optional", T::Bool)]);
msg!(ENV_FROM, "EnvFromSource", [(1, "prefix", T::Str), (2, "configMapRef", T::M(&ENV_FROM_REF)), (3, "secretRef", T::M(&ENV_FROM_REF))]);
msg!(
    CONTAINER_PORT,
    "ContainerPort",
    [(1, "name", T::Str), (2, "hostPort", T::Int0), (3, "containerPort", T::Int), (4, "protocol", T::Str), (5, "hostIP", T::Str)]
);
msg!(CLAIM, "ResourceClaim", [(1, "name", T::Str), (2, "request", T::Str)]);
msg!(RESOURCES, "ResourceRequirements", [(1, "limits", T::QtyMap), (2, "requests", T::QtyMap), (3, "claims", T::Ms(&CLAIM))]);
msg!(
    VOLUME_MOUNT,
    "VolumeMount",
    [
        (1, "name", T::Str),
        (2, "readOnly", T::Bool0),
        (3, "mountPath", T::Str),
        (4, "subPath", T::Str),
        (5, "mountPropagation", T::Str),
        (6, "subPathExpr", T::Str),
        (7, "recursiveReadOnly", T::Str)
    ]
);
msg!(
    CONTAINER,
    "Container",
    [
        (1, "name", T::Str),
        (2, "image", T::Str),
        (3, "command", T::Strs),
        (4, "args", T::Strs),
        (5, "workingDir", T::Str),
        (6, "ports", T::Ms(&CONTAINER_PORT)),
        (7, "env", T::Ms(&ENV)),
        (8, "resources", T::M(&RESOURCES)),
        (9, "volumeMounts", T::Ms(&VOLUME_MOUNT)),
        (13, "terminationMessagePath", T::Str),
        (14, "imagePullPolicy", T::Str),
        (16, "stdin", T::Bool0),
        (17, "stdinOnce", T::Bool0),
        (18, "tty", T::Bool0),
        (19, "envFrom", T::Ms(&ENV_FROM)),
        (20, "terminationMessagePolicy", T::Str),
        (24, "restartPolicy", T::Str)
    ]
);
msg!(
    TOLERATION,
    "Toleration",
    [(1, "key", T::Str), (2, "operator", T::Str), (3, "value", T::Str), (4, "effect", T::Str), (5, "tolerationSeconds", T::Int)]
);
msg!(SE_LINUX, "SELinuxOptions", [(1, "user", T::Str), (2, "role", T::Str), (3, "type", T::Str), (4, "level", T::Str)]);
msg!(SYSCTL, "Sysctl", [(1, "name", T::Str), (2, "value", T::Str)]);
msg!(SECCOMP, "SeccompProfile", [(1, "type", T::Str), (2, "localhostProfile", T::Str)]);
// What the server defaults a pod template to (`securityContext: {}`) comes back in objects
// kubectl reads and writes again (`kubectl create job --from=cronjob/...`).
msg!(
    POD_SECURITY,
    "PodSecurityContext",
    [
        (1, "seLinuxOptions", T::M(&SE_LINUX)),
        (2, "runAsUser", T::Int),
        (3, "runAsNonRoot", T::Bool),
        (5, "fsGroup", T::Int),
        (6, "runAsGroup", T::Int),
        (7, "sysctls", T::Ms(&SYSCTL)),
        (9, "fsGroupChangePolicy", T::Str),
        (10, "seccompProfile", T::M(&SECCOMP)),
        (12, "supplementalGroupsPolicy", T::Str),
        (13, "seLinuxChangePolicy", T::Str)
    ]
);
msg!(
    POD_SPEC,
    "PodSpec",
    [
        (2, "containers", T::Ms(&CONTAINER)),
        (3, "restartPolicy", T::Str),
        (4, "terminationGracePeriodSeconds", T::Int),
        (5, "activeDeadlineSeconds", T::Int),
        (6, "dnsPolicy", T::Str),
        (7, "nodeSelector", T::StrMap),
        (8, "serviceAccountName", T::Str),
        (9, "serviceAccount", T::Str),
        (10, "nodeName", T::Str),
        (11, "hostNetwork", T::Bool0),
        (12, "hostPID", T::Bool0),
        (13, "hostIPC", T::Bool0),
        (14, "securityContext", T::M(&POD_SECURITY)),
        (15, "imagePullSecrets", T::Ms(&LOCAL_REF)),
        (16, "hostname", T::Str),
        (17, "subdomain", T::Str),
        (19, "schedulerName", T::Str),
        (20, "initContainers", T::Ms(&CONTAINER)),
        (21, "automountServiceAccountToken", T::Bool),
        (22, "tolerations", T::Ms(&TOLERATION)),
        (24, "priorityClassName", T::Str),
        (25, "priority", T::Int),
        (27, "shareProcessNamespace", T::Bool),
        (29, "runtimeClassName", T::Str),
        (30, "enableServiceLinks", T::Bool),
        (31, "preemptionPolicy", T::Str),
        (35, "setHostnameAsFQDN", T::Bool),
        (37, "hostUsers", T::Bool)
    ]
);
msg!(POD_TEMPLATE, "PodTemplateSpec", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&POD_SPEC))]);
msg!(POD, "Pod", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&POD_SPEC)), (3, "status", T::Status)]);

// apps/v1
msg!(ROLLING_UPDATE, "RollingUpdateDeployment", [(1, "maxUnavailable", T::IntOrStr), (2, "maxSurge", T::IntOrStr)]);
msg!(STRATEGY, "DeploymentStrategy", [(1, "type", T::Str), (2, "rollingUpdate", T::M(&ROLLING_UPDATE))]);
msg!(
    DEPLOYMENT_SPEC,
    "DeploymentSpec",
    [
        (1, "replicas", T::Int),
        (2, "selector", T::M(&SELECTOR)),
        (3, "template", T::M(&POD_TEMPLATE)),
        (4, "strategy", T::M(&STRATEGY)),
        (5, "minReadySeconds", T::Int0),
        (6, "revisionHistoryLimit", T::Int),
        (7, "paused", T::Bool0),
        (9, "progressDeadlineSeconds", T::Int),
        (10, "podReplacementPolicy", T::Str)
    ]
);
msg!(DEPLOYMENT, "Deployment", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&DEPLOYMENT_SPEC)), (3, "status", T::Status)]);

// core/v1: services and the rest kubectl creates
msg!(
    SERVICE_PORT,
    "ServicePort",
    [
        (1, "name", T::Str),
        (2, "protocol", T::Str),
        (3, "port", T::Int),
        (4, "targetPort", T::IntOrStr),
        (5, "nodePort", T::Int0),
        (6, "appProtocol", T::Str)
    ]
);
msg!(CLIENT_IP, "ClientIPConfig", [(1, "timeoutSeconds", T::Int)]);
msg!(AFFINITY_CONFIG, "SessionAffinityConfig", [(1, "clientIP", T::M(&CLIENT_IP))]);
msg!(
    SERVICE_SPEC,
    "ServiceSpec",
    [
        (1, "ports", T::Ms(&SERVICE_PORT)),
        (2, "selector", T::StrMap),
        (3, "clusterIP", T::Str),
        (4, "type", T::Str),
        (5, "externalIPs", T::Strs),
        (7, "sessionAffinity", T::Str),
        (8, "loadBalancerIP", T::Str),
        (9, "loadBalancerSourceRanges", T::Strs),
        (10, "externalName", T::Str),
        (11, "externalTrafficPolicy", T::Str),
        (12, "healthCheckNodePort", T::Int0),
        (13, "publishNotReadyAddresses", T::Bool0),
        (14, "sessionAffinityConfig", T::M(&AFFINITY_CONFIG)),
        (17, "ipFamilyPolicy", T::Str),
        (18, "clusterIPs", T::Strs),
        (19, "ipFamilies", T::Strs),
        (20, "allocateLoadBalancerNodePorts", T::Bool),
        (21, "loadBalancerClass", T::Str),
        (22, "internalTrafficPolicy", T::Str),
        (23, "trafficDistribution", T::Str)
    ]
);
msg!(SERVICE, "Service", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&SERVICE_SPEC)), (3, "status", T::Status)]);
msg!(
    CONFIG_MAP,
    "ConfigMap",
    [(1, "metadata", T::M(&META)), (2, "data", T::StrMap), (3, "binaryData", T::BytesMap), (4, "immutable", T::Bool)]
);
msg!(
    SECRET,
    "Secret",
    [(1, "metadata", T::M(&META)), (2, "data", T::BytesMap), (3, "type", T::Str), (4, "stringData", T::StrMap), (5, "immutable", T::Bool)]
);
msg!(NAMESPACE_SPEC, "NamespaceSpec", [(1, "finalizers", T::Strs)]);
msg!(NAMESPACE, "Namespace", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&NAMESPACE_SPEC)), (3, "status", T::Status)]);
msg!(
    OBJECT_REF,
    "ObjectReference",
    [
        (1, "kind", T::Str),
        (2, "namespace", T::Str),
        (3, "name", T::Str),
        (4, "uid", T::Str),
        (5, "apiVersion", T::Str),
        (6, "resourceVersion", T::Str),
        (7, "fieldPath", T::Str)
    ]
);
msg!(
    SERVICE_ACCOUNT,
    "ServiceAccount",
    [
        (1, "metadata", T::M(&META)),
        (2, "secrets", T::Ms(&OBJECT_REF)),
        (3, "imagePullSecrets", T::Ms(&LOCAL_REF)),
        (4, "automountServiceAccountToken", T::Bool)
    ]
);
msg!(SCOPE_REQ, "ScopedResourceSelectorRequirement", [(1, "scopeName", T::Str), (2, "operator", T::Str), (3, "values", T::Strs)]);
msg!(SCOPE_SELECTOR, "ScopeSelector", [(1, "matchExpressions", T::Ms(&SCOPE_REQ))]);
msg!(QUOTA_SPEC, "ResourceQuotaSpec", [(1, "hard", T::QtyMap), (2, "scopes", T::Strs), (3, "scopeSelector", T::M(&SCOPE_SELECTOR))]);
msg!(QUOTA, "ResourceQuota", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&QUOTA_SPEC)), (3, "status", T::Status)]);

// batch/v1
msg!(
    JOB_SPEC,
    "JobSpec",
    [
        (1, "parallelism", T::Int),
        (2, "completions", T::Int),
        (3, "activeDeadlineSeconds", T::Int),
        (4, "selector", T::M(&SELECTOR)),
        (5, "manualSelector", T::Bool),
        (6, "template", T::M(&POD_TEMPLATE)),
        (7, "backoffLimit", T::Int),
        (8, "ttlSecondsAfterFinished", T::Int),
        (9, "completionMode", T::Str),
        (10, "suspend", T::Bool),
        (12, "backoffLimitPerIndex", T::Int),
        (13, "maxFailedIndexes", T::Int),
        (14, "podReplacementPolicy", T::Str),
        (15, "managedBy", T::Str)
    ]
);
msg!(JOB, "Job", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&JOB_SPEC)), (3, "status", T::Status)]);
msg!(JOB_TEMPLATE, "JobTemplateSpec", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&JOB_SPEC))]);
msg!(
    CRONJOB_SPEC,
    "CronJobSpec",
    [
        (1, "schedule", T::Str),
        (2, "startingDeadlineSeconds", T::Int),
        (3, "concurrencyPolicy", T::Str),
        (4, "suspend", T::Bool),
        (5, "jobTemplate", T::M(&JOB_TEMPLATE)),
        (6, "successfulJobsHistoryLimit", T::Int),
        (7, "failedJobsHistoryLimit", T::Int),
        (8, "timeZone", T::Str)
    ]
);
msg!(CRONJOB, "CronJob", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&CRONJOB_SPEC)), (3, "status", T::Status)]);

// policy/v1
msg!(
    PDB_SPEC,
    "PodDisruptionBudgetSpec",
    [
        (1, "minAvailable", T::IntOrStr),
        (2, "selector", T::M(&SELECTOR)),
        (3, "maxUnavailable", T::IntOrStr),
        (4, "unhealthyPodEvictionPolicy", T::Str)
    ]
);
msg!(PDB, "PodDisruptionBudget", [(1, "metadata", T::M(&META)), (2, "spec", T::M(&PDB_SPEC)), (3, "status", T::Status)]);

// rbac/v1
msg!(
    POLICY_RULE,
    "PolicyRule",
    [
        (1, "verbs", T::Strs),
        (2, "apiGroups", T::Strs),
        (3, "resources", T::Strs),
        (4, "resourceNames", T::Strs),
        (5, "nonResourceURLs", T::Strs)
    ]
);
msg!(AGGREGATION, "AggregationRule", [(1, "clusterRoleSelectors", T::Ms(&SELECTOR))]);
msg!(ROLE, "Role", [(1, "metadata", T::M(&META)), (2, "rules", T::Ms(&POLICY_RULE))]);
msg!(
    CLUSTER_ROLE,
    "ClusterRole",
    [(1, "metadata", T::M(&META)), (2, "rules", T::Ms(&POLICY_RULE)), (3, "aggregationRule", T::M(&AGGREGATION))]
);
msg!(SUBJECT, "Subject", [(1, "kind", T::Str), (2, "apiGroup", T::Str), (3, "name", T::Str), (4, "namespace", T::Str)]);
msg!(ROLE_REF, "RoleRef", [(1, "apiGroup", T::Str), (2, "kind", T::Str), (3, "name", T::Str)]);
msg!(ROLE_BINDING, "RoleBinding", [(1, "metadata", T::M(&META)), (2, "subjects", T::Ms(&SUBJECT)), (3, "roleRef", T::M(&ROLE_REF))]);
msg!(
    CLUSTER_ROLE_BINDING,
    "ClusterRoleBinding",
    [(1, "metadata", T::M(&META)), (2, "subjects", T::Ms(&SUBJECT)), (3, "roleRef", T::M(&ROLE_REF))]
);

/// The message of a stored kind this table decodes, by (API group, kind).
pub fn message_for(group: &str, kind: &str) -> Option<&'static Msg> {
    Some(match (group, kind) {
        ("", "ConfigMap") => &CONFIG_MAP,
        ("", "Secret") => &SECRET,
        ("", "Namespace") => &NAMESPACE,
        ("", "ServiceAccount") => &SERVICE_ACCOUNT,
        ("", "Service") => &SERVICE,
        ("", "Pod") => &POD,
        ("", "ResourceQuota") => &QUOTA,
        ("apps", "Deployment") => &DEPLOYMENT,
        ("batch", "Job") => &JOB,
        ("batch", "CronJob") => &CRONJOB,
        ("policy", "PodDisruptionBudget") => &PDB,
        ("rbac.authorization.k8s.io", "Role") => &ROLE,
        ("rbac.authorization.k8s.io", "ClusterRole") => &CLUSTER_ROLE,
        ("rbac.authorization.k8s.io", "RoleBinding") => &ROLE_BINDING,
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => &CLUSTER_ROLE_BINDING,
        _ => return None,
    })
}

/// How deep [`is_zero`] looks into a server-written status before giving up (each level costs
/// the attacker two bytes; the stack must not).
const MAX_ZERO_DEPTH: usize = 16;

fn unsupported(msg: &Msg, n: u64) -> ApiError {
    ApiError::unsupported_media_type(format!("protobuf field {n} of {} is not supported by this server; send application/json", msg.name))
}

/// Whether a message holds only zero numbers and empty strings or messages (what Go writes for
/// a status nobody has set).
fn is_zero(b: &[u8], depth: usize) -> bool {
    if b.is_empty() {
        return true;
    }
    if depth >= MAX_ZERO_DEPTH {
        return false;
    }
    let Ok(fs) = fields(b) else { return false };
    fs.into_iter().all(|(_, f)| match f {
        Field::Varint(v) => v == 0,
        Field::Bytes(inner) => is_zero(inner, depth + 1),
        Field::Skip => false,
    })
}

fn map_entry(b: &[u8]) -> Result<(String, Option<&[u8]>), ApiError> {
    let (mut k, mut v) = (String::new(), None);
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(s)) => k = text(s)?,
            (2, Field::Bytes(s)) => v = Some(s),
            _ => return Err(bad()),
        }
    }
    Ok((k, v))
}

fn time(b: &[u8]) -> Result<Option<Value>, ApiError> {
    let (mut secs, mut nanos) = (0i64, 0u32);
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Varint(v)) => secs = v as i64,
            (2, Field::Varint(v)) => nanos = u32::try_from(v).map_err(|_| bad())?,
            _ => return Err(bad()),
        }
    }
    if secs == 0 && nanos == 0 {
        return Ok(None);
    }
    let t = DateTime::from_timestamp(secs, 0).ok_or_else(bad)?;
    Ok(Some(json!(t.to_rfc3339_opts(SecondsFormat::Secs, true))))
}

fn quantity(b: &[u8]) -> Result<Value, ApiError> {
    let mut s = String::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => s = text(x)?,
            _ => return Err(bad()),
        }
    }
    Ok(json!(s))
}

fn int_or_string(b: &[u8]) -> Result<Value, ApiError> {
    let (mut ty, mut i, mut s) = (0u64, 0i64, String::new());
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Varint(v)) => ty = v,
            (2, Field::Varint(v)) => i = i64::from(v as i32),
            (3, Field::Bytes(x)) => s = text(x)?,
            _ => return Err(bad()),
        }
    }
    Ok(if ty == 1 { json!(s) } else { json!(i) })
}

fn push(m: &mut Map<String, Value>, name: &str, v: Value) {
    if let Some(a) = m.entry(name.to_string()).or_insert_with(|| json!([])).as_array_mut() {
        a.push(v);
    }
}

fn put_in_map(m: &mut Map<String, Value>, name: &str, k: String, v: Value) {
    if let Some(o) = m.entry(name.to_string()).or_insert_with(|| json!({})).as_object_mut() {
        o.insert(k, v);
    }
}

/// Decodes one message by its table into `out` (a JSON object).
fn decode_into(buf: &[u8], msg: &Msg, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    for (n, f) in fields(buf)? {
        let Some((_, name, t)) = msg.fields.iter().find(|(num, _, _)| *num == n) else {
            return Err(unsupported(msg, n));
        };
        let name = *name;
        match (t, f) {
            (T::Str, Field::Bytes(b)) => {
                if !b.is_empty() {
                    out.insert(name.into(), json!(text(b)?));
                }
            }
            (T::Strs, Field::Bytes(b)) => push(out, name, json!(text(b)?)),
            (T::Int, Field::Varint(v)) => drop(out.insert(name.into(), json!(v as i64))),
            (T::Int0, Field::Varint(v)) => {
                if v != 0 {
                    out.insert(name.into(), json!(v as i64));
                }
            }
            (T::Bool, Field::Varint(v)) => drop(out.insert(name.into(), json!(v != 0))),
            (T::Bool0, Field::Varint(v)) => {
                if v != 0 {
                    out.insert(name.into(), json!(true));
                }
            }
            (T::M(inner), Field::Bytes(b)) => drop(out.insert(name.into(), message(b, inner)?)),
            (T::Ms(inner), Field::Bytes(b)) => push(out, name, message(b, inner)?),
            (T::Inline(inner), Field::Bytes(b)) => decode_into(b, inner, out)?,
            (T::StrMap, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                put_in_map(out, name, k, json!(text(v.unwrap_or_default())?));
            }
            (T::BytesMap, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                put_in_map(out, name, k, json!(base64::engine::general_purpose::STANDARD.encode(v.unwrap_or_default())));
            }
            (T::QtyMap, Field::Bytes(b)) => {
                let (k, v) = map_entry(b)?;
                put_in_map(out, name, k, quantity(v.unwrap_or_default())?);
            }
            (T::Time, Field::Bytes(b)) => {
                if let Some(t) = time(b)? {
                    out.insert(name.into(), t);
                }
            }
            (T::Qty, Field::Bytes(b)) => drop(out.insert(name.into(), quantity(b)?)),
            (T::IntOrStr, Field::Bytes(b)) => drop(out.insert(name.into(), int_or_string(b)?)),
            (T::FieldsV1, Field::Bytes(b)) => {
                let mut raw: &[u8] = &[];
                for (fnum, ff) in fields(b)? {
                    match (fnum, ff) {
                        (1, Field::Bytes(x)) => raw = x,
                        _ => return Err(bad()),
                    }
                }
                // Bounded as a JSON body is (its memory is charged up front by the caller).
                let v = provisioning_yaml::bounded::json_value(raw, &provisioning_yaml::bounded::Meter::unshared()).map_err(|_| bad())?;
                out.insert(name.into(), v);
            }
            (T::Status, Field::Bytes(b)) => {
                if !is_zero(b, 0) {
                    return Err(ApiError::unsupported_media_type(format!(
                        "a {} status in protobuf is not supported by this server; send application/json",
                        msg.name
                    )));
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

/// Decodes one message by its table into a JSON object.
pub fn message(buf: &[u8], msg: &Msg) -> Result<Value, ApiError> {
    let mut out = Map::new();
    decode_into(buf, msg, &mut out)?;
    Ok(Value::Object(out))
}
