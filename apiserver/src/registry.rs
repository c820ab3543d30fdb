//! The set of served resource types: built-in kinds plus those defined by stored CRDs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// Storage key of namespaces.
pub const NAMESPACES: &str = "/namespaces";
/// Storage key of CRDs.
pub const CRDS: &str = "apiextensions.k8s.io/customresourcedefinitions";
/// The API group of the RBAC kinds (their names are path segments, not DNS names).
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Marks the storage key of create-only virtual resources (reviews): nothing is stored there.
pub const VIRTUAL_PREFIX: &str = "virtual:";

/// The review resources served for discovery: create-only, never stored.
pub fn virtual_types() -> Vec<ResourceType> {
    let mk = |group: &str, plural: &str, kind: &str, namespaced: bool| ResourceType {
        group: group.into(),
        version: "v1".into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: vec![],
        categories: vec![],
        has_status: false,
        printer_columns: vec![],
        schema: None,
        storage: format!("{VIRTUAL_PREFIX}{group}/{plural}"),
        custom: false,
        storage_version: true,
        rules: None,
        scale: None,
    };
    vec![
        mk("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview", false),
        mk("authentication.k8s.io", "tokenreviews", "TokenReview", false),
        mk("authorization.k8s.io", "localsubjectaccessreviews", "LocalSubjectAccessReview", true),
        mk("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview", false),
        mk("authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview", false),
        mk("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview", false),
    ]
}

/// One printer column (from a CRD's additionalPrinterColumns or the defaults).
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// OpenAPI type (string, integer, number, boolean, date).
    pub type_: String,
    /// OpenAPI format (e.g. `name`).
    pub format: String,
    /// Human description.
    pub description: String,
    /// 0 = always shown; higher only with `-o wide`.
    pub priority: i64,
    /// Simple JSONPath evaluated against the object.
    pub json_path: String,
}

/// One served resource at one group/version.
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group ("" for core).
    pub group: String,
    /// Served version.
    pub version: String,
    /// Plural resource name used in URLs.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Kind of the list.
    pub list_kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: Vec<String>,
    /// Categories (e.g. `all`, `provisioning`).
    pub categories: Vec<String>,
    /// Whether `/status` is a separate subresource.
    pub has_status: bool,
    /// Printer columns for Table output (without the leading Name column).
    pub printer_columns: Vec<PrinterColumn>,
    /// The openAPIV3Schema of a CRD version.
    pub schema: Option<Value>,
    /// Identifies the storage shared by every version of this resource.
    pub storage: String,
    /// Whether this is a custom resource (strategic merge patch is then refused).
    pub custom: bool,
    /// Whether this version is the storage version.
    pub storage_version: bool,
    /// The schema's compiled `x-kubernetes-validations` rules (None when it has none).
    pub rules: Option<Arc<crate::celrules::Rules>>,
    /// The `/scale` subresource's paths, when the kind has one (see [`crate::scale`]).
    pub scale: Option<ScalePaths>,
}

/// Where a kind keeps what its `autoscaling/v1` Scale shows (a CRD's `subresources.scale`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    /// `.spec.replicas`-style path of the desired count.
    pub spec_replicas: String,
    /// Path of the observed count (0 when absent).
    pub status_replicas: String,
    /// Path of the selector: a string, or (built-in kinds) a LabelSelector object.
    pub label_selector: Option<String>,
}

impl ScalePaths {
    /// The paths of the built-in workload kinds (spec.replicas, status.replicas, spec.selector).
    fn workload() -> Self {
        ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: Some(".spec.selector".into()),
        }
    }
}

impl ResourceType {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    fn builtin(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool, short: &[&str]) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: vec![],
            has_status: false,
            printer_columns: vec![age_column()],
            schema: None,
            storage: format!("{group}/{plural}"),
            custom: false,
            storage_version: true,
            rules: None,
            scale: None,
        }
    }

    /// The discovery entry (`APIResource`) for this type and its subresources.
    pub fn discovery(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        if self.storage.starts_with(VIRTUAL_PREFIX) {
            main["verbs"] = json!(["create"]);
        }
        let mut out = vec![main];
        if self.group.is_empty() && self.plural == "serviceaccounts" {
            out.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io",
                "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
        if self.has_status {
            out.push(json!({"name": format!("{}/status", self.plural), "singularName": "", "namespaced": self.namespaced,
                "kind": self.kind, "verbs": ["get", "patch", "update"]}));
        }
        if self.scale.is_some() {
            out.push(json!({"name": format!("{}/scale", self.plural), "singularName": "", "namespaced": self.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        out
    }
}

fn age_column() -> PrinterColumn {
    PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }
}

/// Built-in kinds served without any CRD.
#[allow(clippy::too_many_lines, reason = "a data table: the built-in kinds and their printer columns")]
pub fn builtins() -> Vec<ResourceType> {
    let mut ns = ResourceType::builtin("", "v1", "namespaces", "Namespace", false, &["ns"]);
    ns.has_status = true;
    ns.printer_columns = vec![
        PrinterColumn {
            name: "Status".into(),
            type_: "string".into(),
            format: String::new(),
            description: "The status of the namespace".into(),
            priority: 0,
            json_path: ".status.phase".into(),
        },
        age_column(),
    ];
    let mut secret = ResourceType::builtin("", "v1", "secrets", "Secret", true, &[]);
    secret.printer_columns = vec![
        PrinterColumn {
            name: "Type".into(),
            type_: "string".into(),
            format: String::new(),
            description: "Type of the secret".into(),
            priority: 0,
            json_path: ".type".into(),
        },
        PrinterColumn {
            name: "Data".into(),
            type_: "string".into(),
            format: String::new(),
            description: "Number of keys".into(),
            priority: 0,
            json_path: "#datacount".into(),
        },
        age_column(),
    ];
    let mut cm = ResourceType::builtin("", "v1", "configmaps", "ConfigMap", true, &["cm"]);
    cm.printer_columns = vec![
        PrinterColumn {
            name: "Data".into(),
            type_: "string".into(),
            format: String::new(),
            description: "Number of keys".into(),
            priority: 0,
            json_path: "#datacount".into(),
        },
        age_column(),
    ];
    let mut ev = ResourceType::builtin("", "v1", "events", "Event", true, &["ev"]);
    // kube-apiserver's Event printer (pkg/printers/internalversion/printers.go), in its order;
    // it has no leading Name column: Name comes last, wide only.
    let col = |name: &str, priority: i64, path: &str, description: &str| PrinterColumn {
        name: name.into(),
        type_: "string".into(),
        format: if path == ".metadata.name" { "name".into() } else { String::new() },
        description: description.into(),
        priority,
        json_path: path.into(),
    };
    ev.printer_columns = vec![
        col("Last Seen", 0, "#lastseen", "The time at which the most recent occurrence of this event was recorded."),
        col("Type", 0, ".type", "Type of this event (Normal, Warning), new types could be added in the future"),
        col(
            "Reason",
            0,
            ".reason",
            "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
        ),
        col("Object", 0, "#involved", "The object that this event is about."),
        col(
            "Subobject",
            1,
            "#fieldpath",
            "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
        ),
        col("Source", 1, "#source", "The component reporting this event. Should be a short machine understandable string."),
        col("Message", 0, "#message", "A human-readable description of the status of this operation."),
        col("First Seen", 1, "#firstseen", "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)"),
        col("Count", 1, "#count", "The number of times this event has occurred."),
        col("Name", 1, ".metadata.name", "Name must be unique within a namespace."),
    ];
    ev.storage = "/events".into();
    let mut ev2 = ResourceType::builtin("events.k8s.io", "v1", "events", "Event", true, &[]);
    ev2.storage = "/events".into();
    ev2.printer_columns = ev.printer_columns.clone();
    let mut lease = ResourceType::builtin("coordination.k8s.io", "v1", "leases", "Lease", true, &[]);
    lease.printer_columns = vec![
        PrinterColumn {
            name: "Holder".into(),
            type_: "string".into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: ".spec.holderIdentity".into(),
        },
        age_column(),
    ];
    let mut crd = ResourceType::builtin(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
    );
    crd.has_status = true;
    crd.categories = vec!["api-extensions".into()];
    crd.printer_columns = vec![PrinterColumn {
        name: "Created At".into(),
        type_: "date".into(),
        format: String::new(),
        description: String::new(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }];
    let mut all = vec![ns, secret, cm, ev, ev2, lease, crd];
    all.extend(workload_builtins());
    all.extend(unrun_builtins());
    for rt in &mut all {
        // CRD objects keep their own checks (handlers::normalize_crd): the nested
        // openAPIV3Schema is recursive and is validated as a schema, not as data.
        if rt.storage != CRDS {
            rt.schema = crate::builtin_schemas::structural(&rt.group, &rt.version, &rt.kind);
        }
    }
    all
}

/// A printer column; `json_path` starting with `#builtin:` is computed in
/// [`crate::builtin_cells`] (values such as `1/2` or `80/TCP` that no JSONPath yields).
fn col(name: &str, type_: &str, json_path: &str, priority: i64, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: description.into(),
        priority,
        json_path: json_path.into(),
    }
}

/// The kinds a cluster deployment (deploy/) uses: ServiceAccount, Service, Deployment, the
/// RBAC kinds, PodDisruptionBudget and NetworkPolicy. They are stored and served like any
/// other kind; nothing acts on them (no kubelet, no endpoints controller), as in a cluster
/// without nodes. Columns follow kubectl's printers for these kinds (pkg/printers/internalversion).
// Over 80 lines on purpose: a data table (see above).
fn workload_builtins() -> Vec<ResourceType> {
    let mut sa = ResourceType::builtin("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"]);
    sa.printer_columns = vec![
        col(
            "Secrets",
            "string",
            "#builtin:sa-secrets",
            0,
            "Secrets is the list of secrets allowed to be used by pods running using this ServiceAccount.",
        ),
        age_column(),
    ];
    let mut svc = ResourceType::builtin("", "v1", "services", "Service", true, &["svc"]);
    svc.has_status = true;
    svc.categories = vec!["all".into()];
    svc.printer_columns = vec![
        col("Type", "string", ".spec.type", 0, "The type of the service."),
        col("Cluster-IP", "string", "#builtin:svc-cluster-ip", 0, "The IP address of the service."),
        col("External-IP", "string", "#builtin:svc-external-ip", 0, "The external IP address of the service."),
        col("Port(s)", "string", "#builtin:svc-ports", 0, "The ports of the service."),
        age_column(),
        col("Selector", "string", "#builtin:selector-map", 1, "The selector of the service."),
    ];
    let mut deploy = ResourceType::builtin("apps", "v1", "deployments", "Deployment", true, &["deploy"]);
    deploy.has_status = true;
    deploy.scale = Some(ScalePaths::workload());
    deploy.categories = vec!["all".into()];
    deploy.printer_columns = vec![
        col("Ready", "string", "#builtin:deploy-ready", 0, "Number of the pod with ready state."),
        col(
            "Up-to-date",
            "string",
            "#builtin:deploy-updated",
            0,
            "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
        ),
        col(
            "Available",
            "string",
            "#builtin:deploy-available",
            0,
            "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
        ),
        age_column(),
        col("Containers", "string", "#builtin:containers", 1, "Names of each container in the template."),
        col("Images", "string", "#builtin:images", 1, "Images referenced by each container in the template."),
        col(
            "Selector",
            "string",
            "#builtin:selector",
            1,
            "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
        ),
    ];
    // kubectl shows the timestamp itself here, not an age.
    let created_at = || col("Created At", "string", ".metadata.creationTimestamp", 0, "Time at which the object was created.");
    let mut role = ResourceType::builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", true, &[]);
    role.printer_columns = vec![created_at()];
    let mut crole = ResourceType::builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", false, &[]);
    crole.printer_columns = vec![created_at()];
    let binding_cols = || {
        vec![
            col("Role", "string", "#builtin:binding-role", 0, "Role to which the binding refers."),
            age_column(),
            col("Users", "string", "#builtin:binding-users", 1, "Users in the binding."),
            col("Groups", "string", "#builtin:binding-groups", 1, "Groups in the binding."),
            col("ServiceAccounts", "string", "#builtin:binding-sas", 1, "ServiceAccounts in the binding."),
        ]
    };
    let mut rb = ResourceType::builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", true, &[]);
    rb.printer_columns = binding_cols();
    let mut crb = ResourceType::builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", false, &[]);
    crb.printer_columns = binding_cols();
    let mut pdb = ResourceType::builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true, &["pdb"]);
    pdb.has_status = true;
    pdb.printer_columns = vec![
        col("Min Available", "string", "#builtin:pdb-min", 0, "The minimum number of pods that must be available."),
        col("Max Unavailable", "string", "#builtin:pdb-max", 0, "The maximum number of pods that may be unavailable."),
        col(
            "Allowed Disruptions",
            "integer",
            ".status.disruptionsAllowed",
            0,
            "Calculated number of pods that may be disrupted at this time.",
        ),
        age_column(),
    ];
    let mut netpol = ResourceType::builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true, &["netpol"]);
    netpol.printer_columns =
        vec![col("Pod-Selector", "string", "#builtin:netpol-selector", 0, "The pod selector of the NetworkPolicy."), age_column()];
    vec![sa, svc, deploy, role, crole, rb, crb, pdb, netpol]
}

/// The core and workload kinds every client expects to find (k9s opens Pods, `kubectl get
/// all` lists Pods, ReplicaSets, StatefulSets, DaemonSets, Jobs, CronJobs): stored and served
/// like any other kind, with upstream's schemas and columns, but nothing runs them — the
/// embedded control plane has no nodes, kubelet, scheduler or workload controllers. A Pod is
/// stored with `PodScheduled=False` saying so ([`crate::objects::unrun_pod_status`]).
#[allow(clippy::too_many_lines, reason = "a data table: the unrun built-in kinds and their printer columns")]
fn unrun_builtins() -> Vec<ResourceType> {
    let with = |mut rt: ResourceType, status: bool, all: bool, cols: Vec<PrinterColumn>| {
        rt.has_status = status;
        if rt.group == "apps" && matches!(rt.plural.as_str(), "replicasets" | "statefulsets") {
            rt.scale = Some(ScalePaths::workload());
        }
        if all {
            rt.categories = vec!["all".into()];
        }
        rt.printer_columns = cols;
        rt
    };
    let path = |name: &str, type_: &str, json_path: &str| col(name, type_, json_path, 0, "");
    let wide = |name: &str, json_path: &str| col(name, "string", json_path, 1, "");
    vec![
        with(
            ResourceType::builtin("", "v1", "pods", "Pod", true, &["po"]),
            true,
            true,
            vec![
                col("Ready", "string", "#builtin:pod-ready", 0, "The aggregate readiness state of this pod for accepting traffic."),
                col("Status", "string", "#builtin:pod-status", 0, "The aggregate status of the containers in this pod."),
                col(
                    "Restarts",
                    "string",
                    "#builtin:pod-restarts",
                    0,
                    "The number of times the containers in this pod have been restarted.",
                ),
                age_column(),
                wide("IP", ".status.podIP"),
                wide("Node", ".spec.nodeName"),
            ],
        ),
        with(
            ResourceType::builtin("", "v1", "nodes", "Node", false, &["no"]),
            true,
            false,
            vec![
                col("Status", "string", "#builtin:node-status", 0, "The status of the node"),
                path("Roles", "string", "#builtin:node-roles"),
                age_column(),
                path("Version", "string", ".status.nodeInfo.kubeletVersion"),
            ],
        ),
        with(
            ResourceType::builtin("apps", "v1", "replicasets", "ReplicaSet", true, &["rs"]),
            true,
            true,
            vec![
                path("Desired", "integer", ".spec.replicas"),
                path("Current", "integer", ".status.replicas"),
                path("Ready", "integer", ".status.readyReplicas"),
                age_column(),
            ],
        ),
        with(
            ResourceType::builtin("apps", "v1", "statefulsets", "StatefulSet", true, &["sts"]),
            true,
            true,
            vec![col("Ready", "string", "#builtin:deploy-ready", 0, "Number of the pods with ready state."), age_column()],
        ),
        with(
            ResourceType::builtin("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"]),
            true,
            true,
            vec![
                path("Desired", "integer", ".status.desiredNumberScheduled"),
                path("Current", "integer", ".status.currentNumberScheduled"),
                path("Ready", "integer", ".status.numberReady"),
                path("Up-to-date", "integer", ".status.updatedNumberScheduled"),
                path("Available", "integer", ".status.numberAvailable"),
                age_column(),
            ],
        ),
        with(
            ResourceType::builtin("batch", "v1", "jobs", "Job", true, &[]),
            true,
            true,
            vec![col("Completions", "string", "#builtin:job-completions", 0, "The completed and desired completions."), age_column()],
        ),
        with(
            ResourceType::builtin("batch", "v1", "cronjobs", "CronJob", true, &["cj"]),
            true,
            true,
            vec![
                path("Schedule", "string", ".spec.schedule"),
                path("Suspend", "boolean", ".spec.suspend"),
                col("Active", "integer", "#builtin:cronjob-active", 0, "The number of running jobs."),
                path("Last Schedule", "date", ".status.lastScheduleTime"),
                age_column(),
            ],
        ),
        with(
            ResourceType::builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true, &["pvc"]),
            true,
            false,
            vec![
                path("Status", "string", ".status.phase"),
                path("Volume", "string", ".spec.volumeName"),
                path("Capacity", "string", ".status.capacity.storage"),
                path("StorageClass", "string", ".spec.storageClassName"),
                age_column(),
            ],
        ),
        with(
            ResourceType::builtin("", "v1", "persistentvolumes", "PersistentVolume", false, &["pv"]),
            true,
            false,
            vec![
                path("Capacity", "string", ".spec.capacity.storage"),
                path("Reclaim Policy", "string", ".spec.persistentVolumeReclaimPolicy"),
                path("Status", "string", ".status.phase"),
                path("StorageClass", "string", ".spec.storageClassName"),
                age_column(),
            ],
        ),
        with(ResourceType::builtin("", "v1", "endpoints", "Endpoints", true, &["ep"]), false, false, vec![age_column()]),
        with(
            ResourceType::builtin("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", true, &[]),
            false,
            false,
            vec![
                path("AddressType", "string", ".addressType"),
                col("Endpoints", "string", "#builtin:slice-endpoints", 0, ""),
                age_column(),
            ],
        ),
        with(ResourceType::builtin("", "v1", "resourcequotas", "ResourceQuota", true, &["quota"]), true, false, vec![age_column()]),
        with(ResourceType::builtin("", "v1", "limitranges", "LimitRange", true, &["limits"]), false, false, vec![age_column()]),
    ]
}

/// Resource types derived from one CRD object (one per served version).
pub fn from_crd(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return vec![];
    }
    let singular = names["singular"].as_str().map(str::to_string).unwrap_or_else(|| kind.to_lowercase());
    let list_kind = names["listKind"].as_str().map(str::to_string).unwrap_or_else(|| format!("{kind}List"));
    let strs = |v: &Value| -> Vec<String> {
        v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
    };
    let short_names = strs(&names["shortNames"]);
    let categories = strs(&names["categories"]);
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let mut out = vec![];
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        let Some(version) = v["name"].as_str() else { continue };
        let mut cols: Vec<PrinterColumn> = v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some(PrinterColumn {
                    name: c["name"].as_str()?.to_string(),
                    type_: c["type"].as_str().unwrap_or("string").to_string(),
                    format: c["format"].as_str().unwrap_or_default().to_string(),
                    description: c["description"].as_str().unwrap_or_default().to_string(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                    json_path: c["jsonPath"].as_str()?.to_string(),
                })
            })
            .collect();
        if v.get("additionalPrinterColumns").is_none() {
            cols.push(age_column());
        }
        let schema = v["schema"].get("openAPIV3Schema").cloned();
        let rules = schema.as_ref().map(crate::celrules::Rules::from_schema).filter(|r| !r.is_empty()).map(Arc::new);
        out.push(ResourceType {
            group: group.clone(),
            version: version.to_string(),
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            list_kind: list_kind.clone(),
            namespaced,
            short_names: short_names.clone(),
            categories: categories.clone(),
            has_status: v["subresources"].get("status").is_some(),
            printer_columns: cols,
            schema,
            storage: format!("{group}/{plural}"),
            custom: true,
            storage_version: v["storage"].as_bool().unwrap_or(false),
            rules,
            scale: v["subresources"].get("scale").and_then(|sc| {
                Some(ScalePaths {
                    spec_replicas: sc["specReplicasPath"].as_str()?.to_string(),
                    status_replicas: sc["statusReplicasPath"].as_str()?.to_string(),
                    label_selector: sc["labelSelectorPath"].as_str().map(str::to_string),
                })
            }),
        });
    }
    out
}

/// An immutable snapshot of everything served; replaced whenever CRDs change.
#[derive(Debug, Default)]
pub struct Registry {
    /// (group, version) -> resources at that version.
    pub by_gv: BTreeMap<(String, String), Vec<Arc<ResourceType>>>,
    /// Groups in the order they are listed in discovery, with their versions (preferred first).
    pub groups: Vec<(String, Vec<String>)>,
}

impl Registry {
    /// Builds a registry from the built-ins and the given CRD objects.
    pub fn build(crds: &[Value]) -> Self {
        let mut reg = Registry::default();
        let mut all = builtins();
        all.extend(virtual_types());
        for crd in crds {
            // A CRD being deleted stops serving new objects only once it is gone; keep it.
            all.extend(from_crd(crd));
        }
        let mut group_versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut group_order: Vec<String> = vec![];
        for rt in all {
            let key = (rt.group.clone(), rt.version.clone());
            let vs = group_versions.entry(rt.group.clone()).or_default();
            if !vs.contains(&rt.version) {
                vs.push(rt.version.clone());
            }
            if !group_order.contains(&rt.group) {
                group_order.push(rt.group.clone());
            }
            let list = reg.by_gv.entry(key).or_default();
            if !list.iter().any(|r| r.plural == rt.plural) {
                list.push(Arc::new(rt));
            }
        }
        for g in group_order {
            let mut vs = group_versions.remove(&g).unwrap_or_default();
            vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
            reg.groups.push((g, vs));
        }
        reg
    }

    /// Looks a resource up by group, version and plural.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_gv.get(&(group.to_string(), version.to_string()))?.iter().find(|r| r.plural == plural).cloned()
    }

    /// Every served type for a storage key.
    pub fn by_storage(&self, storage: &str) -> Option<Arc<ResourceType>> {
        let mut best: Option<Arc<ResourceType>> = None;
        for list in self.by_gv.values() {
            for r in list {
                if r.storage == storage && (best.is_none() || r.storage_version) {
                    best = Some(r.clone());
                }
            }
        }
        best
    }

    /// All namespaced storage keys.
    pub fn namespaced_storages(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_gv.values().flatten().filter(|r| r.namespaced).map(|r| r.storage.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// `APIGroupList` for `/apis`.
    pub fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self.groups.iter().filter(|(g, _)| !g.is_empty()).map(|(g, vs)| group_doc(g, vs)).collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `APIGroup` for `/apis/GROUP`.
    pub fn api_group(&self, group: &str) -> Option<Value> {
        self.groups.iter().find(|(g, _)| g == group).map(|(g, vs)| {
            let mut d = group_doc(g, vs);
            d["kind"] = json!("APIGroup");
            d["apiVersion"] = json!("v1");
            d
        })
    }

    /// `APIResourceList` for one group/version.
    pub fn api_resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let list = self.by_gv.get(&(group.to_string(), version.to_string()))?;
        let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        let resources: Vec<Value> = list.iter().flat_map(|r| r.discovery()).collect();
        Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
    }
}

fn group_doc(g: &str, vs: &[String]) -> Value {
    let versions: Vec<Value> = vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": g, "versions": versions, "preferredVersion": preferred})
}

/// Kubernetes version ordering: GA > beta > alpha, then by numbers.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let re = |s: &str| s.parse::<u32>().unwrap_or(0);
    let Some(rest) = v.strip_prefix('v') else { return (0, 0, 0) };
    if let Some((major, minor)) = rest.split_once("beta") {
        (2, re(major), re(minor))
    } else if let Some((major, minor)) = rest.split_once("alpha") {
        (1, re(major), re(minor))
    } else if rest.chars().all(|c| c.is_ascii_digit()) {
        (3, re(rest), 0)
    } else {
        (0, 0, 0)
    }
}
