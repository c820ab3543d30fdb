//! Cluster templates: the topologies users start from (`etcd_cluster`, `postgres_redis`, …),
//! rendered into ordinary manifests (Namespace, Workspace where needed, Cluster) to commit to
//! Git. Each template is a directory `templates/<name>/` holding `template.yaml` (name,
//! description, parameters with type and default) and `manifests.yaml.j2` (minijinja).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Environment variable naming the templates directory (default: `templates/` next to the
/// catalog directory).
pub const TEMPLATES_ENV: &str = "PROVISIONING_TEMPLATES";

/// The manifest file of a template directory.
pub const TEMPLATE_MANIFEST: &str = "template.yaml";
/// The minijinja source of a template directory.
pub const TEMPLATE_SOURCE: &str = "manifests.yaml.j2";

/// A template that cannot be loaded or rendered, or a parameter that is wrong. Messages name
/// the file, the template and the parameter.
#[derive(Debug, thiserror::Error)]
pub enum ClusterTemplateError {
    /// Reading a file or directory failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A template's files are wrong.
    #[error("invalid template {path}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// No template of that name.
    #[error("no template {name:?} (available: {})", available.join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        available: Vec<String>,
    },
    /// `--set` names a parameter the template does not have.
    #[error("template {template} has no parameter {parameter:?} (parameters: {})", known.join(", "))]
    UnknownParameter {
        /// The template.
        template: String,
        /// The parameter asked for.
        parameter: String,
        /// The template's parameters.
        known: Vec<String>,
    },
    /// A parameter value does not fit its type.
    #[error("template {template}: parameter {parameter}={value:?} is invalid: {problem}")]
    BadValue {
        /// The template.
        template: String,
        /// The parameter.
        parameter: String,
        /// The value given.
        value: String,
        /// What is expected.
        problem: String,
    },
    /// A `--set` argument that is not `key=value`, or a key given twice.
    #[error("--set {0}")]
    BadSet(String),
    /// The template did not render, or rendered something that is not manifests.
    #[error("template {template} did not render: {message}")]
    Render {
        /// The template.
        template: String,
        /// Why.
        message: String,
    },
}

/// The type of a template parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParameterType {
    /// Free text (no control characters); rendered as a quoted YAML string.
    String,
    /// A Kubernetes object name (DNS-1123 label: lower-case letters, digits, '-', ≤ 63).
    Name,
    /// A whole number, within `minimum`/`maximum` when given.
    Integer,
    /// `true` or `false`.
    Boolean,
}

/// One parameter of a template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateParameter {
    /// Name used with `--set NAME=VALUE` and in the template.
    pub name: String,
    /// What it sets.
    pub description: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: ParameterType,
    /// The value when not set.
    pub default: Value,
    /// When not empty: the only values allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "enum")]
    pub allowed: Vec<String>,
    /// Smallest integer allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<i64>,
    /// Largest integer allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<i64>,
}

impl TemplateParameter {
    /// Parses and checks `text` as a value of this parameter.
    pub fn parse(&self, text: &str) -> Result<Value, String> {
        let value = match self.kind {
            ParameterType::String => {
                if text.chars().any(char::is_control) {
                    return Err("control characters are not allowed".into());
                }
                Value::String(text.to_string())
            }
            ParameterType::Name => {
                if !is_dns_label(text) {
                    return Err("must be a name: 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit".into());
                }
                Value::String(text.to_string())
            }
            ParameterType::Integer => {
                let n: i64 = text.trim().parse().map_err(|_| "must be a whole number".to_string())?;
                if let Some(min) = self.minimum
                    && n < min
                {
                    return Err(format!("must be at least {min}"));
                }
                if let Some(max) = self.maximum
                    && n > max
                {
                    return Err(format!("must be at most {max}"));
                }
                Value::from(n)
            }
            ParameterType::Boolean => match text.trim() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err("must be true or false".into()),
            },
        };
        if !self.allowed.is_empty() && !self.allowed.iter().any(|a| Some(a.as_str()) == value.as_str()) {
            return Err(format!("must be one of {}", self.allowed.join(", ")));
        }
        Ok(value)
    }

    /// The default as `--set` would spell it.
    pub fn default_text(&self) -> String {
        match &self.default {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

/// `template.yaml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateManifest {
    /// Template name; must equal the directory name.
    pub name: String,
    /// What topology it makes.
    pub description: String,
    /// Namespace of the rendered objects when `-n` is not given.
    pub default_namespace: String,
    /// Parameters, in the order `template list` shows them.
    #[serde(default)]
    pub parameters: Vec<TemplateParameter>,
}

/// One loaded template.
#[derive(Clone, Debug)]
pub struct ClusterTemplate {
    /// Its manifest.
    pub manifest: TemplateManifest,
    /// Its directory.
    pub dir: PathBuf,
    source: String,
}

/// What a render produced.
#[derive(Clone, Debug)]
pub struct RenderedTemplate {
    /// The manifests as YAML text (multi-document), headed by a comment naming the template
    /// and the parameters used.
    pub yaml: String,
    /// The same documents, parsed.
    pub objects: Vec<Value>,
    /// The namespace of the namespaced objects.
    pub namespace: String,
    /// Every parameter's value.
    pub values: BTreeMap<String, Value>,
}

impl RenderedTemplate {
    /// The catalog services the rendered Clusters and TaskServs name, sorted.
    pub fn services(&self) -> Vec<String> {
        let mut out = BTreeSet::new();
        for object in &self.objects {
            match object.get("kind").and_then(Value::as_str) {
                Some("Cluster") => {
                    for t in object.pointer("/spec/taskservs").and_then(Value::as_array).into_iter().flatten() {
                        if let Some(s) = t.get("service").and_then(Value::as_str) {
                            out.insert(s.to_string());
                        }
                    }
                }
                Some("TaskServ") => {
                    if let Some(s) = object.pointer("/spec/service").and_then(Value::as_str) {
                        out.insert(s.to_string());
                    }
                }
                _ => {}
            }
        }
        out.into_iter().collect()
    }
}

impl ClusterTemplate {
    /// Template name.
    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    /// Renders with `sets` (`NAME=VALUE`, each parameter at most once) in `namespace` (default:
    /// the template's `defaultNamespace`). Unknown parameters and bad values are errors naming
    /// them; nothing is rendered then.
    pub fn render(&self, sets: &[String], namespace: Option<&str>) -> Result<RenderedTemplate, ClusterTemplateError> {
        let template = self.name().to_string();
        let mut values: BTreeMap<String, Value> = self.manifest.parameters.iter().map(|p| (p.name.clone(), p.default.clone())).collect();
        let mut seen = BTreeSet::new();
        for set in sets {
            let Some((key, text)) = set.split_once('=') else {
                return Err(ClusterTemplateError::BadSet(format!("{set:?}: expected NAME=VALUE")));
            };
            let key = key.trim();
            let Some(parameter) = self.manifest.parameters.iter().find(|p| p.name == key) else {
                return Err(ClusterTemplateError::UnknownParameter {
                    template,
                    parameter: key.to_string(),
                    known: self.manifest.parameters.iter().map(|p| p.name.clone()).collect(),
                });
            };
            if !seen.insert(key.to_string()) {
                return Err(ClusterTemplateError::BadSet(format!("{key} is given more than once")));
            }
            let value = parameter.parse(text).map_err(|problem| ClusterTemplateError::BadValue {
                template: template.clone(),
                parameter: key.to_string(),
                value: text.to_string(),
                problem,
            })?;
            values.insert(key.to_string(), value);
        }
        let namespace = namespace.unwrap_or(&self.manifest.default_namespace).to_string();
        if !is_dns_label(&namespace) {
            return Err(ClusterTemplateError::BadValue {
                template,
                parameter: "namespace".into(),
                value: namespace,
                problem: "must be a name: 1-63 lower-case letters, digits or '-'".into(),
            });
        }
        let render_error = |message: String| ClusterTemplateError::Render { template: template.clone(), message };
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_keep_trailing_newline(true);
        // YAML by hand: values go through `tojson` where needed, nothing is auto-escaped.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.add_template(TEMPLATE_SOURCE, &self.source).map_err(|e| render_error(e.to_string()))?;
        let mut context = values.clone();
        context.insert("namespace".into(), Value::String(namespace.clone()));
        context.insert("template".into(), Value::String(template.clone()));
        let body = env.get_template(TEMPLATE_SOURCE).and_then(|t| t.render(&context)).map_err(|e| render_error(format!("{e:#}")))?;
        let objects = parse_documents(&body).map_err(render_error)?;
        let sets_text: Vec<String> = self.manifest.parameters.iter().map(|p| format!("{}={}", p.name, text_of(&values[&p.name]))).collect();
        let header = format!(
            "# Rendered by `provisioning template render {template} -n {namespace}` with {}\n# {}\n",
            sets_text.join(" "),
            self.manifest.description.trim()
        );
        Ok(RenderedTemplate { yaml: format!("{header}{}", body.trim_start()), objects, namespace, values })
    }
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The documents of rendered YAML: each must be an object with apiVersion, kind and
/// metadata.name (empty documents are skipped).
fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let values = provisioning_yaml::documents::<Value>(text).map_err(|e| format!("document {} is not valid YAML: {}", e.index, e.error))?;
    for (i, value) in values.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let has = |pointer: &str| value.pointer(pointer).and_then(Value::as_str).is_some_and(|s| !s.is_empty());
        if !(has("/apiVersion") && has("/kind") && has("/metadata/name")) {
            return Err(format!("document {} lacks apiVersion, kind or metadata.name", i + 1));
        }
        out.push(value);
    }
    if out.is_empty() {
        return Err("no objects".into());
    }
    Ok(out)
}

/// Every template of a directory, by name.
#[derive(Clone, Debug)]
pub struct TemplateLibrary {
    dir: PathBuf,
    templates: BTreeMap<String, ClusterTemplate>,
}

impl TemplateLibrary {
    /// `$PROVISIONING_TEMPLATES` when set, else `templates/` next to `catalog_dir`.
    pub fn default_dir(catalog_dir: &Path) -> PathBuf {
        match std::env::var_os(TEMPLATES_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => catalog_dir.parent().unwrap_or(Path::new(".")).join("templates"),
        }
    }

    /// Loads every `<dir>/<name>/` (hidden directories skipped) and checks its files:
    /// manifest shape, name = directory, parameter names unique, defaults valid, source parses.
    pub fn load(dir: &Path) -> Result<TemplateLibrary, ClusterTemplateError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ClusterTemplateError::Io { path, source }
        };
        let mut dirs = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            if entry.file_type().map_err(io(&entry.path()))?.is_dir() {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        let mut templates = BTreeMap::new();
        for template_dir in dirs {
            let dir_name = template_dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if dir_name.starts_with('.') {
                continue;
            }
            let template = load_template(&template_dir, &dir_name)?;
            templates.insert(dir_name, template);
        }
        Ok(TemplateLibrary { dir: dir.to_path_buf(), templates })
    }

    /// The directory loaded.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// All templates, by name.
    pub fn templates(&self) -> impl Iterator<Item = &ClusterTemplate> {
        self.templates.values()
    }

    /// A template by name.
    pub fn get(&self, name: &str) -> Option<&ClusterTemplate> {
        self.templates.get(name)
    }

    /// A template by name, or an error listing the ones there are.
    pub fn require(&self, name: &str) -> Result<&ClusterTemplate, ClusterTemplateError> {
        self.get(name)
            .ok_or_else(|| ClusterTemplateError::Unknown { name: name.to_string(), available: self.templates.keys().cloned().collect() })
    }
}

fn load_template(dir: &Path, dir_name: &str) -> Result<ClusterTemplate, ClusterTemplateError> {
    let path = dir.join(TEMPLATE_MANIFEST);
    let invalid = |problem: String| ClusterTemplateError::Invalid { path: path.clone(), problem };
    // Regular files only, read without following a symlink or blocking on a FIFO.
    let text = crate::catalog::read_regular_text(&path).map_err(|e| invalid(e.to_string()))?;
    let manifest: TemplateManifest = provisioning_yaml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if manifest.name != dir_name {
        return Err(invalid(format!("name {:?} differs from its directory {dir_name:?}", manifest.name)));
    }
    if manifest.description.trim().is_empty() {
        return Err(invalid("description is empty".into()));
    }
    if !is_dns_label(&manifest.default_namespace) {
        return Err(invalid(format!("defaultNamespace {:?} is not a valid namespace name", manifest.default_namespace)));
    }
    let mut names = BTreeSet::new();
    for p in &manifest.parameters {
        let identifier =
            p.name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) && p.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !identifier || matches!(p.name.as_str(), "namespace" | "template") {
            return Err(invalid(format!("parameter name {:?} must be an identifier other than namespace and template", p.name)));
        }
        if !names.insert(p.name.as_str()) {
            return Err(invalid(format!("parameter {:?} is declared twice", p.name)));
        }
        if p.description.trim().is_empty() {
            return Err(invalid(format!("parameter {} has no description", p.name)));
        }
        p.parse(&p.default_text()).map_err(|problem| invalid(format!("default of parameter {}: {problem}", p.name)))?;
    }
    let source_path = dir.join(TEMPLATE_SOURCE);
    let source = crate::catalog::read_regular_text(&source_path)
        .map_err(|e| ClusterTemplateError::Invalid { path: source_path.clone(), problem: e.to_string() })?;
    let mut env = Environment::new();
    env.add_template(TEMPLATE_SOURCE, &source)
        .map_err(|e| ClusterTemplateError::Invalid { path: source_path.clone(), problem: e.to_string() })?;
    Ok(ClusterTemplate { manifest, dir: dir.to_path_buf(), source })
}

/// A DNS-1123 label (namespace and object names).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_template(root: &Path, name: &str, manifest: &str, source: &str) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join(TEMPLATE_MANIFEST), manifest).expect("write");
        std::fs::write(dir.join(TEMPLATE_SOURCE), source).expect("write");
    }

    const MANIFEST: &str = "name: t\ndescription: a test\ndefaultNamespace: demo\nparameters:\n\
        - {name: name, description: cluster name, type: name, default: c}\n\
        - {name: replicas, description: members, type: integer, default: 3, minimum: 1, maximum: 5}\n\
        - {name: plan, description: size, type: string, default: small, enum: [small, large]}\n\
        - {name: tls, description: on or off, type: boolean, default: true}\n";
    const SOURCE: &str = "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {name: {{ name | tojson }}, namespace: {{ namespace | tojson }}}\n\
        spec:\n  pools: [{name: m, replicas: {{ replicas }}, plan: {{ plan | tojson }}}]\n  taskservs: [{service: etcd, config: {tls: {{ tls | tojson }}}}]\n";

    #[test]
    fn sets_are_typed_and_checked_and_unknown_ones_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_template(dir.path(), "t", MANIFEST, SOURCE);
        let library = TemplateLibrary::load(dir.path()).expect("loads");
        let t = library.require("t").expect("found");
        let r = t.render(&["replicas=5".into(), "plan=large".into(), "tls=false".into()], Some("team-a")).expect("renders");
        assert_eq!(r.objects[0].pointer("/spec/pools/0/replicas"), Some(&Value::from(5)));
        assert_eq!(r.objects[0].pointer("/spec/pools/0/plan"), Some(&Value::from("large")));
        assert_eq!(r.objects[0].pointer("/spec/taskservs/0/config/tls"), Some(&Value::Bool(false)));
        assert_eq!(r.objects[0].pointer("/metadata/namespace"), Some(&Value::from("team-a")));
        assert_eq!(r.services(), vec!["etcd".to_string()]);
        assert!(r.yaml.starts_with("# Rendered by `provisioning template render t -n team-a` with name=c replicas=5"), "{}", r.yaml);

        let err = |sets: &[&str]| t.render(&sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(), None).expect_err("refused").to_string();
        let e = err(&["size=3"]);
        assert!(e.contains("no parameter \"size\"") && e.contains("name, replicas, plan, tls"), "{e}");
        let e = err(&["replicas=9"]);
        assert!(e.contains("replicas=\"9\"") && e.contains("at most 5"), "{e}");
        assert!(err(&["replicas=three"]).contains("whole number"));
        assert!(err(&["plan=huge"]).contains("one of small, large"));
        assert!(err(&["tls=yes"]).contains("true or false"));
        assert!(err(&["name=Bad_Name"]).contains("parameter name=\"Bad_Name\""));
        assert!(err(&["replicas"]).contains("expected NAME=VALUE"));
        assert!(err(&["replicas=1", "replicas=2"]).contains("more than once"));
        assert!(t.render(&[], Some("Not A Namespace")).is_err());
        assert!(library.require("nope").expect_err("unknown").to_string().contains("available: t"));
    }

    #[test]
    fn a_string_cannot_break_out_of_its_yaml_scalar() {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest =
            "name: t\ndescription: d\ndefaultNamespace: demo\nparameters:\n- {name: label, description: x, type: string, default: a}\n";
        let source = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {label: {{ label | tojson }}}\n";
        write_template(dir.path(), "t", manifest, source);
        let t = TemplateLibrary::load(dir.path()).expect("loads").require("t").expect("found").clone();
        let r = t.render(&["label=a\"}, evil: {x: 1".into()], None).expect("renders");
        assert_eq!(r.objects.len(), 1);
        assert_eq!(r.objects[0].pointer("/data/label"), Some(&Value::from("a\"}, evil: {x: 1")));
        assert!(r.objects[0].get("evil").is_none());
        assert!(t.render(&["label=a\nb".into()], None).expect_err("refused").to_string().contains("control characters"));
    }

    #[test]
    fn broken_templates_are_named_at_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_template(dir.path(), "t", &MANIFEST.replace("default: 3,", "default: 9,"), SOURCE);
        let e = TemplateLibrary::load(dir.path()).expect_err("refused").to_string();
        assert!(e.contains("t/template.yaml") && e.contains("default of parameter replicas"), "{e}");
        write_template(dir.path(), "t", MANIFEST, "{% if %}");
        let e = TemplateLibrary::load(dir.path()).expect_err("refused").to_string();
        assert!(e.contains("t/manifests.yaml.j2"), "{e}");
        write_template(dir.path(), "t", &MANIFEST.replace("name: t\n", "name: u\n"), SOURCE);
        assert!(TemplateLibrary::load(dir.path()).expect_err("refused").to_string().contains("differs from its directory"));
    }
}
