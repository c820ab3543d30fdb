//! CRD `x-kubernetes-validations` rules, evaluated with the `cel` crate.
//!
//! Rules are collected from a version's `openAPIV3Schema` once per registry build (whenever a CRD
//! changes); each distinct rule source is parsed once and kept in a process-wide cache. On every
//! write of a custom resource (create, update, patch, apply, status) the rules are evaluated at
//! their schema location — the object root, nested objects, array items, map values — with
//! `self` bound to the (defaulted and pruned) value there and, on update, `oldSelf` bound to the
//! correlated old value. Rules that reference `oldSelf` are skipped when there is no old value
//! (create, or an array item of a list that is not `x-kubernetes-list-type: map`), as
//! kube-apiserver does. Unchanged values on update are not re-validated (validation
//! ratcheting), except by transition rules.
//!
//! ## Cost bound
//!
//! The `cel` crate has no runtime cost accounting, so evaluation is bounded before it starts by
//! an estimate over the actual object: one step per expression node, and a comprehension
//! (`all`, `exists`, `exists_one`, `map`, `filter`) counts its body once per element of the
//! longest list or map its range is in this object — `self.pools` is as long as the object's
//! pools, `t.pools` (with `t` bound to `self.taskservs`' items) as long as the longest of their
//! `pools`. A range that is no plain field path (a concatenation, a call's result) is assumed as
//! long as the whole value bound to `self`/`oldSelf` (its list elements and map entries, plus
//! one). So a large free-form field (a service's `config`) does not make a rule that never
//! iterates it expensive, which a bound from the value's total size did (a Cluster with a few
//! pools and a config of a hundred entries was refused by its depth-3 pools rule).
//! A rule whose estimate exceeds [`RULE_COST_LIMIT`] is not run and the write is rejected
//! (`... call cost exceeds limit for rule: ...`), like kube-apiserver's per-call limit; the
//! estimates of all rules of one request are summed against [`REQUEST_COST_BUDGET`] (`validation
//! failed due to running out of cost budget`). As a backstop, evaluation of one request stops
//! once [`REQUEST_TIME_BUDGET`] of wall-clock time has been spent (a rule already running is
//! not interrupted; at the per-rule limit one evaluation takes about 0.3 s in a release build).
//! Pairwise rules such as "names must be unique" thus accept lists of a few hundred items;
//! linear rules lists of tens of thousands. The
//! handlers evaluate objects of more than 20,000 nodes on the blocking pool, so a long
//! evaluation never stalls the async runtime serving other requests.
//!
//! Not supported: Kubernetes' own CEL libraries (`quantity()`, `url()`, `ip()`, `cidr()`,
//! `format()`, kube's list functions such as `isSorted()`/`sum()`), `duration()`/`timestamp()`
//! (the crate's `chrono` feature is off), `optionalOldSelf`, and static type checking at CRD
//! creation (the crate only parses, so a misspelled function is reported when the rule runs).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use serde_json::Value;

use crate::error::Cause;

/// Largest estimated cost of one rule evaluation.
pub const RULE_COST_LIMIT: u64 = 1_000_000;
/// Largest sum of estimated costs of all rule evaluations of one request.
pub const REQUEST_COST_BUDGET: u64 = 10_000_000;
/// Wall-clock backstop for all rule evaluations of one request.
pub const REQUEST_TIME_BUDGET: Duration = Duration::from_secs(2);
/// Evaluation error texts are cut to this many characters (they may print whole values).
const MAX_ERROR_CHARS: usize = 300;
/// Bound on the process-wide program cache (cleared when full).
const MAX_CACHED_PROGRAMS: usize = 4096;

static ENV: LazyLock<Arc<cel::Env>> = LazyLock::new(|| {
    let mut env = cel::Env::stdlib();
    let _ = env.add_extension(cel::extensions::strings);
    let _ = env.add_extension(cel::extensions::lists);
    Arc::new(env)
});

/// A parsed rule source with what the evaluator needs to know about it.
pub struct Compiled {
    program: cel::Program,
    uses_old_self: bool,
}

type CompileResult = Result<Arc<Compiled>, String>;

static PROGRAMS: LazyLock<Mutex<HashMap<String, CompileResult>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Parses `source` once per process (cached by source text). Never panics.
pub fn compile(source: &str) -> CompileResult {
    let mut cache = match PROGRAMS.lock() {
        Ok(c) => c,
        Err(p) => p.into_inner(),
    };
    if let Some(r) = cache.get(source) {
        return r.clone();
    }
    let env = ENV.clone();
    let result = match catch_unwind(AssertUnwindSafe(|| env.compile(source))) {
        Ok(Ok(program)) => {
            let uses_old_self = program.references().has_variable("oldSelf");
            Ok(Arc::new(Compiled { program, uses_old_self }))
        }
        Ok(Err(e)) => Err(truncate(&e.to_string())),
        Err(_) => Err("the CEL parser failed on this expression".to_string()),
    };
    if cache.len() >= MAX_CACHED_PROGRAMS {
        cache.clear();
    }
    cache.insert(source.to_string(), result.clone());
    result
}

/// The estimated cost of running `compiled` with `self` = `new` and `oldSelf` = `old`
/// ([`estimate`]; `n` the size of both values, for ranges it cannot follow).
fn rule_cost(compiled: &Compiled, new: &Value, old: Option<&Value>, n: u64) -> u64 {
    let mut env: Scope = vec![("self", Some(vec![new])), ("oldSelf", old.map(|o| vec![o]))];
    estimate(compiled.program.expression(), &mut env, n, 0)
}

/// What an identifier may stand for while estimating: every value it can be bound to, or
/// unknown (then any list it iterates is assumed as long as the whole value).
type Candidates<'v> = Option<Vec<&'v Value>>;

/// Identifiers bound while estimating, innermost last.
type Scope<'e, 'v> = Vec<(&'e str, Candidates<'v>)>;

/// The values `e` evaluates to when it is a field path from a bound identifier (`self.a.b`,
/// `t.pools`), else unknown.
fn resolve<'v>(e: &IdedExpr, env: &Scope<'_, 'v>, guard: u32) -> Candidates<'v> {
    if guard > 200 {
        return None;
    }
    match &e.expr {
        Expr::Ident(name) => env.iter().rev().find(|(n, _)| n == name).and_then(|(_, c)| c.clone()),
        Expr::Select(sel) if !sel.test => {
            let operands = resolve(&sel.operand, env, guard + 1)?;
            Some(operands.into_iter().filter_map(|v| v.get(&sel.field)).collect())
        }
        _ => None,
    }
}

/// An upper estimate of the steps evaluating `e` takes with `env` bound: one per node, and a
/// comprehension's body once per element of the longest list or map its range can be (the
/// actual lengths in the object being validated, as kube-apiserver's runtime cost counts what
/// is there, not the schema's bounds). A range that is no plain field path (a concatenation, a
/// call's result) is assumed `n` long, `n` being the size of the whole value.
fn estimate<'e, 'v>(e: &'e IdedExpr, env: &mut Scope<'e, 'v>, n: u64, guard: u32) -> u64 {
    if guard > 200 {
        return n;
    }
    let mut parts: Vec<&'e IdedExpr> = vec![];
    match &e.expr {
        Expr::Call(c) => {
            parts.extend(c.target.iter().map(|t| &**t));
            parts.extend(c.args.iter());
        }
        Expr::List(l) => parts.extend(l.elements.iter()),
        Expr::Select(sel) => parts.push(&sel.operand),
        Expr::Map(m) => m.entries.iter().for_each(|en| entry_parts(&en.expr, &mut parts)),
        Expr::Struct(st) => st.entries.iter().for_each(|en| entry_parts(&en.expr, &mut parts)),
        Expr::Comprehension(c) => {
            let (len, elements) = match resolve(&c.iter_range, env, 0) {
                Some(values) => {
                    let len = values
                        .iter()
                        .map(|v| match v {
                            Value::Array(a) => a.len() as u64,
                            Value::Object(m) => m.len() as u64,
                            _ => 0,
                        })
                        .max()
                        .unwrap_or(0);
                    // A list's elements are what the loop variable stands for; a map's keys
                    // are strings, with nothing inside to iterate.
                    let elements: Vec<&'v Value> = values.iter().filter_map(|v| v.as_array()).flatten().collect();
                    (len, Some(elements))
                }
                None => (n, None),
            };
            let mut outer = 1u64;
            for x in [&c.iter_range, &c.accu_init, &c.result] {
                outer = outer.saturating_add(estimate(x, env, n, guard + 1));
            }
            let bound = env.len();
            env.push((c.iter_var.as_str(), elements));
            if let Some(v2) = &c.iter_var2 {
                env.push((v2.as_str(), None));
            }
            env.push((c.accu_var.as_str(), None));
            let mut body = 1u64;
            for x in [&c.loop_cond, &c.loop_step] {
                body = body.saturating_add(estimate(x, env, n, guard + 1));
            }
            env.truncate(bound);
            return outer.saturating_add(len.saturating_mul(body));
        }
        _ => {}
    }
    parts.into_iter().fold(1u64, |acc, x| acc.saturating_add(estimate(x, env, n, guard + 1)))
}

fn entry_parts<'e>(e: &'e EntryExpr, parts: &mut Vec<&'e IdedExpr>) {
    match e {
        EntryExpr::StructField(f) => parts.push(&f.value),
        EntryExpr::MapEntry(m) => {
            parts.push(&m.key);
            parts.push(&m.value);
        }
    }
}

fn truncate(s: &str) -> String {
    if s.chars().count() <= MAX_ERROR_CHARS {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX_ERROR_CHARS).collect();
        t.push_str("...");
        t
    }
}

/// One step from a schema node to a child schema node.
#[derive(Debug, Clone)]
enum Step {
    /// `properties[name]`.
    Prop(String),
    /// `items`; with the list-map keys when `x-kubernetes-list-type: map` (old items correlate).
    Items(Option<Vec<String>>),
    /// `additionalProperties`.
    Addl,
}

/// One `x-kubernetes-validations` entry.
struct Rule {
    source: String,
    compiled: CompileResult,
    message: String,
    message_expression: Option<CompileResult>,
    field_path: Option<String>,
    reason: String,
    /// Where the rule sits, e.g. `.properties[spec].x-kubernetes-validations[0]`.
    schema_path: String,
}

impl Rule {
    /// kube-apiserver's `ruleErrorString`.
    fn error_string(&self) -> String {
        if self.message.trim().is_empty() { self.source.trim().to_string() } else { self.message.trim().to_string() }
    }
    /// kube-apiserver's `ruleMessageOrDefault`.
    fn message_or_default(&self) -> String {
        if self.message.trim().is_empty() { format!("failed rule: {}", self.error_string()) } else { self.message.trim().to_string() }
    }
}

/// The rules attached to one schema node.
struct Group {
    steps: Vec<Step>,
    /// The schema node the rules sit on (guides JSON-to-CEL conversion).
    schema: Value,
    schema_type: String,
    rules: Vec<Rule>,
}

/// The compiled `x-kubernetes-validations` rules of one CRD version's schema.
#[derive(Default)]
pub struct Rules {
    groups: Vec<Group>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n: usize = self.groups.iter().map(|g| g.rules.len()).sum();
        write!(f, "Rules({n})")
    }
}

impl Rules {
    /// Collects and compiles every rule of an `openAPIV3Schema`.
    pub fn from_schema(schema: &Value) -> Rules {
        let mut rules = Rules::default();
        collect(schema, &mut vec![], "", true, &mut rules.groups, 0);
        rules
    }

    /// Whether the schema has no rules.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Rules that do not compile, as causes for a CRD write; `base` is the path of the schema,
    /// e.g. `spec.versions[0].schema.openAPIV3Schema`.
    pub fn compile_errors(&self, base: &str) -> Vec<Cause> {
        let mut out = vec![];
        for g in &self.groups {
            for r in &g.rules {
                if let Err(e) = &r.compiled {
                    out.push(Cause::new(
                        "FieldValueInvalid",
                        format!("{base}{}.rule", r.schema_path),
                        format!("Invalid value: {}: compilation failed: {e}", json_str(&r.source)),
                    ));
                }
                if let Some(Err(e)) = &r.message_expression {
                    out.push(Cause::new(
                        "FieldValueInvalid",
                        format!("{base}{}.messageExpression", r.schema_path),
                        format!("Invalid value: {}: messageExpression compilation failed: {e}", json_str(&r.source)),
                    ));
                }
            }
        }
        out
    }

    /// Evaluates every rule against `new` (the whole object after defaulting and pruning), with
    /// `old` the stored object on update. Stops once the causes' list is full (the object is
    /// refused whatever the other rules say).
    // Over 80 lines on purpose: one pass over the rules with the cost budget, oldSelf and
    // messageExpression handling side by side, as upstream's validator evaluates them.
    pub fn validate(&self, new: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut causes = crate::error::Causes::default();
        let (started, mut spent) = (Instant::now(), 0u64);
        for g in &self.groups {
            let mut locs = vec![];
            locate(new, old, &g.steps, String::new(), &mut locs);
            for (path, nv, ov) in locs {
                if causes.overflowed() {
                    return causes.into_vec();
                }
                let root = g.steps.is_empty();
                let field = if root { "<nil>".to_string() } else { path.clone() };
                let unchanged = ov.is_some_and(|o| o == nv);
                let mut size: Option<u64> = None;
                let mut bound: Option<(cel::Value, Option<cel::Value>)> = None;
                for r in &g.rules {
                    let compiled = match &r.compiled {
                        Ok(c) => c.clone(),
                        Err(e) => {
                            causes.push(invalid(&field, &g.schema_type, format!("rule compile error: {e}")));
                            continue;
                        }
                    };
                    if compiled.uses_old_self && ov.is_none() {
                        continue;
                    }
                    if unchanged && !compiled.uses_old_self {
                        continue;
                    }
                    let n = *size.get_or_insert_with(|| 1 + count(nv, 0) + ov.map(|o| count(o, 0)).unwrap_or(0));
                    let cost = rule_cost(&compiled, nv, ov, n);
                    if cost > RULE_COST_LIMIT {
                        causes.push(invalid(
                            &field,
                            &g.schema_type,
                            format!(
                                "no further validation rules will be run due to call cost exceeds limit for rule: {}",
                                r.error_string()
                            ),
                        ));
                        return causes.into_vec();
                    }
                    spent = spent.saturating_add(cost);
                    if spent > REQUEST_COST_BUDGET || started.elapsed() > REQUEST_TIME_BUDGET {
                        causes.push(invalid(
                            &field,
                            &g.schema_type,
                            "validation failed due to running out of cost budget, no further validation rules will be run".to_string(),
                        ));
                        return causes.into_vec();
                    }
                    let (sv, osv) = bound.get_or_insert_with(|| {
                        let sc = Some(&g.schema);
                        let s = if root { to_cel(&root_view(nv), sc, 0) } else { to_cel(nv, sc, 0) };
                        let o = ov.map(|o| if root { to_cel(&root_view(o), sc, 0) } else { to_cel(o, sc, 0) });
                        (s, o)
                    });
                    let mut ctx = cel::Context::with_env(ENV.clone());
                    ctx.add_variable_from_value("self", sv.clone());
                    if let Some(o) = osv {
                        ctx.add_variable_from_value("oldSelf", o.clone());
                    }
                    let field = match &r.field_path {
                        Some(fp) if !fp.trim_start_matches('.').is_empty() => {
                            let fp = fp.trim_start_matches('.');
                            if root { fp.to_string() } else { format!("{path}.{fp}") }
                        }
                        _ => field.clone(),
                    };
                    match catch_unwind(AssertUnwindSafe(|| compiled.program.execute(&ctx))) {
                        Ok(Ok(cel::Value::Bool(true))) => {}
                        Ok(Ok(cel::Value::Bool(false))) => {
                            let detail = message_from_expression(r, &ctx).unwrap_or_else(|| r.message_or_default());
                            causes.push(field_error(&field, &g.schema_type, &r.reason, detail));
                        }
                        Ok(Ok(other)) => causes.push(invalid(
                            &field,
                            &g.schema_type,
                            format!("rule did not evaluate to a bool but to {} evaluating rule: {}", other.type_of(), r.error_string()),
                        )),
                        Ok(Err(e)) => {
                            let overload = matches!(e, cel::ExecutionError::NoSuchOverload(_));
                            let e = truncate(&e.to_string());
                            let msg = if overload {
                                format!(
                                    "'{e}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                                    r.error_string()
                                )
                            } else {
                                format!("{e} evaluating rule: {}", r.error_string())
                            };
                            causes.push(invalid(&field, &g.schema_type, msg));
                        }
                        Err(_) => {
                            causes.push(invalid(&field, &g.schema_type, format!("internal error evaluating rule: {}", r.error_string())))
                        }
                    }
                }
            }
        }
        causes.into_vec()
    }
}

/// `messageExpression`'s result when it evaluates to a non-empty single-line string.
fn message_from_expression(r: &Rule, ctx: &cel::Context) -> Option<String> {
    let Some(Ok(c)) = &r.message_expression else { return None };
    match catch_unwind(AssertUnwindSafe(|| c.program.execute(ctx))) {
        Ok(Ok(cel::Value::String(s))) if !s.trim().is_empty() && !s.contains('\n') => Some(s.trim().to_string()),
        _ => None,
    }
}

fn json_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn invalid(field: &str, schema_type: &str, detail: String) -> Cause {
    Cause::new("FieldValueInvalid", field, format!("Invalid value: {}: {detail}", json_str(schema_type)))
}

/// kube-apiserver's `fieldErrorForReason`.
fn field_error(field: &str, schema_type: &str, reason: &str, detail: String) -> Cause {
    match reason {
        "FieldValueForbidden" => Cause::new("FieldValueForbidden", field, format!("Forbidden: {detail}")),
        "FieldValueRequired" => Cause::new("FieldValueRequired", field, format!("Required value: {detail}")),
        "FieldValueDuplicate" => Cause::new("FieldValueDuplicate", field, format!("Duplicate value: {}", json_str(schema_type))),
        _ => invalid(field, schema_type, detail),
    }
}

/// What `self` sees at the object root: `metadata` holds only `name` and `generateName`.
fn root_view(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut()
        && let Some(md) = m.get("metadata").and_then(Value::as_object)
    {
        let mut keep = serde_json::Map::new();
        for k in ["name", "generateName"] {
            if let Some(x) = md.get(k) {
                keep.insert(k.to_string(), x.clone());
            }
        }
        m.insert("metadata".into(), Value::Object(keep));
    }
    v
}

/// Size of a JSON value in list elements and map entries (decides where rules are evaluated).
pub fn weight(v: &Value) -> u64 {
    count(v, 0)
}

/// Number of list elements and map entries inside a value.
fn count(v: &Value, depth: u32) -> u64 {
    if depth > 256 {
        return 0;
    }
    match v {
        Value::Array(a) => a.len() as u64 + a.iter().map(|x| count(x, depth + 1)).sum::<u64>(),
        Value::Object(m) => m.len() as u64 + m.values().map(|x| count(x, depth + 1)).sum::<u64>(),
        _ => 0,
    }
}

/// JSON to a CEL value, guided by the schema where there is one: integers as `int` (`uint`
/// above i64) except in `type: number` fields, which are always `double`, as in kube-apiserver.
fn to_cel(v: &Value, schema: Option<&Value>, depth: u32) -> cel::Value {
    let schema = schema.filter(|_| depth < 256);
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            let double = schema.and_then(|s| s.get("type")).and_then(Value::as_str) == Some("number");
            if double {
                cel::Value::Float(n.as_f64().unwrap_or(0.0))
            } else if let Some(i) = n.as_i64() {
                cel::Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                cel::Value::UInt(u)
            } else {
                cel::Value::Float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => {
            let items = schema.and_then(|s| s.get("items"));
            cel::Value::List(Arc::new(a.iter().map(|x| to_cel(x, items, depth + 1)).collect()))
        }
        Value::Object(m) => {
            let props = schema.and_then(|s| s.get("properties"));
            let addl = schema.and_then(|s| s.get("additionalProperties")).filter(|a| a.is_object());
            let map: HashMap<cel::objects::Key, cel::Value> = m
                .iter()
                .map(|(k, x)| {
                    let cs = props.and_then(|p| p.get(k)).or(addl);
                    (cel::objects::Key::String(Arc::new(k.clone())), to_cel(x, cs, depth + 1))
                })
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
    }
}

/// Every value at the schema location `steps`, with its field path and correlated old value.
fn locate<'a>(v: &'a Value, old: Option<&'a Value>, steps: &[Step], path: String, out: &mut Vec<(String, &'a Value, Option<&'a Value>)>) {
    if v.is_null() {
        return;
    }
    let Some((step, rest)) = steps.split_first() else {
        out.push((path, v, old.filter(|o| !o.is_null())));
        return;
    };
    match step {
        Step::Prop(k) => {
            if let Some(c) = v.get(k) {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                locate(c, old.and_then(|o| o.get(k)), rest, p, out);
            }
        }
        Step::Addl => {
            if let Some(m) = v.as_object() {
                for (k, c) in m {
                    locate(c, old.and_then(|o| o.get(k)), rest, format!("{path}[{k}]"), out);
                }
            }
        }
        Step::Items(keys) => {
            if let Some(a) = v.as_array() {
                // Old items of a list-map, indexed by their key values (linear, not pairwise).
                let key_of = |item: &Value, keys: &[String]| -> String {
                    Value::Array(keys.iter().map(|k| item.get(k).cloned().unwrap_or(Value::Null)).collect()).to_string()
                };
                let index: Option<HashMap<String, &'a Value>> = match (keys, old.and_then(Value::as_array)) {
                    (Some(keys), Some(olds)) => Some(olds.iter().map(|o| (key_of(o, keys), o)).collect()),
                    _ => None,
                };
                for (i, c) in a.iter().enumerate() {
                    let oc = match (keys, &index) {
                        (Some(keys), Some(index)) => index.get(&key_of(c, keys)).copied(),
                        _ => None,
                    };
                    locate(c, oc, rest, format!("{path}[{i}]"), out);
                }
            }
        }
    }
}

fn collect(s: &Value, steps: &mut Vec<Step>, schema_path: &str, root: bool, out: &mut Vec<Group>, depth: u32) {
    if depth > 64 || !s.is_object() {
        return;
    }
    if let Some(vs) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
        let mut rules = vec![];
        for (i, v) in vs.iter().enumerate() {
            let source = v.get("rule").and_then(Value::as_str).unwrap_or_default().to_string();
            let compiled = compile(&source);
            let message_expression = v.get("messageExpression").and_then(Value::as_str).filter(|m| !m.trim().is_empty()).map(compile);
            rules.push(Rule {
                source,
                compiled,
                message: v.get("message").and_then(Value::as_str).unwrap_or_default().to_string(),
                message_expression,
                field_path: v.get("fieldPath").and_then(Value::as_str).map(str::to_string),
                reason: v.get("reason").and_then(Value::as_str).unwrap_or("FieldValueInvalid").to_string(),
                schema_path: format!("{schema_path}.x-kubernetes-validations[{i}]"),
            });
        }
        if !rules.is_empty() {
            let schema_type = s.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
            out.push(Group { steps: steps.clone(), schema: s.clone(), schema_type, rules });
        }
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, cs) in props {
            if root && k == "metadata" {
                continue;
            }
            steps.push(Step::Prop(k.clone()));
            collect(cs, steps, &format!("{schema_path}.properties[{k}]"), false, out, depth + 1);
            steps.pop();
        }
    }
    if let Some(items) = s.get("items") {
        let keys = if s.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
            s.get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_string)).collect::<Vec<_>>())
        } else {
            None
        };
        steps.push(Step::Items(keys));
        collect(items, steps, &format!("{schema_path}.items"), false, out, depth + 1);
        steps.pop();
    }
    if let Some(addl) = s.get("additionalProperties").filter(|a| a.is_object()) {
        steps.push(Step::Addl);
        collect(addl, steps, &format!("{schema_path}.additionalProperties"), false, out, depth + 1);
        steps.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.pools.all(p, self.pools.exists_one(q, q.name == p.name))", "message": "pool names must be unique"},
                {"rule": "!has(self.replicas) || self.replicas >= 0"},
                {"rule": "self.missing == 1"},
                {"rule": "!has(self.mode) || self.mode == oldSelf.mode", "message": "mode is immutable"}
            ],
            "properties": {
                "replicas": {"type": "integer"},
                "mode": {"type": "string"},
                "pools": {"type": "array", "items": {"type": "object",
                    "x-kubernetes-validations": [{"rule": "self.size > 0", "messageExpression": "'size of ' + self.name + ' must be positive'"}],
                    "properties": {"name": {"type": "string"}, "size": {"type": "integer"}}}}}}}})
    }

    fn msgs(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| format!("{}: {}", c.field, c.message)).collect()
    }

    #[test]
    fn rules_at_every_location() {
        let rules = Rules::from_schema(&schema());
        assert!(rules.compile_errors("x").is_empty());
        let obj = json!({"metadata": {"name": "a"}, "spec": {"replicas": -1, "mode": "a",
            "pools": [{"name": "p", "size": 1}, {"name": "p", "size": 0}]}});
        let m = msgs(&rules.validate(&obj, None));
        assert!(m.contains(&"spec: Invalid value: \"object\": pool names must be unique".to_string()), "{m:?}");
        assert!(
            m.contains(&"spec: Invalid value: \"object\": failed rule: !has(self.replicas) || self.replicas >= 0".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec: Invalid value: \"object\": No such key: missing evaluating rule: self.missing == 1".to_string()),
            "{m:?}"
        );
        assert!(m.contains(&"spec.pools[1]: Invalid value: \"object\": size of p must be positive".to_string()), "{m:?}");
        assert!(!m.iter().any(|x| x.contains("immutable")), "{m:?}");
        let old = json!({"spec": {"mode": "b"}});
        let m = msgs(&rules.validate(&obj, Some(&old)));
        assert!(m.contains(&"spec: Invalid value: \"object\": mode is immutable".to_string()), "{m:?}");
    }

    #[test]
    fn scalars_and_map_values() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "mode": {"type": "string", "x-kubernetes-validations": [{"rule": "self.startsWith('m')", "reason": "FieldValueForbidden", "message": "bad mode"}]},
            "labels": {"type": "object", "additionalProperties": {"type": "string",
                "x-kubernetes-validations": [{"rule": "size(self) < 4"}]}}}}}});
        let rules = Rules::from_schema(&s);
        let mut m = msgs(&rules.validate(&json!({"spec": {"mode": "x", "labels": {"a": "ok", "b": "toolong"}}}), None));
        m.sort();
        assert_eq!(
            m,
            vec![
                "spec.labels[b]: Invalid value: \"string\": failed rule: size(self) < 4".to_string(),
                "spec.mode: Forbidden: bad mode".to_string()
            ]
        );
    }

    #[test]
    fn list_map_items_correlate_with_old_items_by_key() {
        // Correctness only: speed belongs in benchmarks, and a wall-clock budget makes a
        // timed unit test flaky on a loaded 2-core machine.
        let s = json!({"type": "object", "properties": {"items": {"type": "array",
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "x-kubernetes-validations": [{"rule": "self.v >= oldSelf.v"}]}}}});
        let rules = Rules::from_schema(&s);
        let old: Vec<Value> = (0..2_000).map(|i| json!({"name": format!("n{i}"), "v": 1})).collect();
        // Reversed order: items must be matched by key, not by index.
        let mut new: Vec<Value> = old.iter().rev().cloned().collect();
        new[0]["v"] = json!(0);
        let m = msgs(&rules.validate(&json!({"items": new}), Some(&json!({"items": old}))));
        assert_eq!(m, vec!["items[0]: Invalid value: \"object\": failed rule: self.v >= oldSelf.v".to_string()]);
    }

    #[test]
    fn numbers_follow_the_schema() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.ratio + 0.5 > 1.0 && self.count + 1 == 3"}],
            "properties": {"ratio": {"type": "number"}, "count": {"type": "integer"}}}}});
        let rules = Rules::from_schema(&s);
        assert!(rules.validate(&json!({"spec": {"ratio": 1, "count": 2}}), None).is_empty());
        assert_eq!(rules.validate(&json!({"spec": {"ratio": 0, "count": 2}}), None).len(), 1);
    }

    #[test]
    fn malformed_and_big() {
        let s = json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.spec.x =="}]});
        let rules = Rules::from_schema(&s);
        let e = rules.compile_errors("spec.versions[0].schema.openAPIV3Schema");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.versions[0].schema.openAPIV3Schema.x-kubernetes-validations[0].rule");
        assert!(!rules.validate(&json!({}), None).is_empty());

        let rules = Rules::from_schema(&schema());
        let pools: Vec<Value> = (0..100_000).map(|i| json!({"name": format!("p{i}"), "size": 1})).collect();
        let obj = json!({"spec": {"pools": pools}});
        // The estimate rejects the rule before running it; the deadline only guards a hang.
        let t = Instant::now();
        let m = msgs(&rules.validate(&obj, None));
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
        assert!(m.iter().any(|x| x.contains("call cost exceeds limit")), "{:?}", &m[..m.len().min(3)]);
    }

    #[test]
    fn the_estimate_follows_what_a_rule_iterates_not_the_objects_size() {
        // The Cluster's rule: each taskserv's pools must name pools of spec.pools (depth 3).
        let s = json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-validations": [
            {"rule": "!has(self.taskservs) || self.taskservs.all(t, !has(t.pools) || t.pools.all(n, self.pools.exists(p, p.name == n)))",
             "message": "taskservs[].pools must name pools of spec.pools"}],
            "properties": {"pools": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                "taskservs": {"type": "array", "items": {"type": "object", "properties": {
                    "pools": {"type": "array", "items": {"type": "string"}},
                    "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}}});
        let rules = Rules::from_schema(&s);
        // Three pools, two services, one with a config of 2,000 entries: the rule never iterates
        // it, so it runs (the bound from the whole value's size, 2,000^3, refused it).
        let config: serde_json::Map<String, Value> = (0..2_000).map(|i| (format!("k{i}"), json!([i, i + 1]))).collect();
        let ok = json!({"spec": {"pools": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "taskservs": [{"pools": ["a", "b"], "config": config}, {"pools": ["c"]}]}});
        assert!(rules.validate(&ok, None).is_empty(), "{:?}", msgs(&rules.validate(&ok, None)));
        let mut bad = ok.clone();
        bad["spec"]["taskservs"][1]["pools"] = json!(["nope"]);
        assert_eq!(msgs(&rules.validate(&bad, None)), ["spec: Invalid value: \"object\": taskservs[].pools must name pools of spec.pools"]);
        // What the rule does iterate still bounds it: 200 services × 100 pools each × 100 pools.
        let pools: Vec<Value> = (0..100).map(|i| json!({"name": format!("p{i}")})).collect();
        let names: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
        let taskservs: Vec<Value> = (0..200).map(|_| json!({"pools": names})).collect();
        let m = msgs(&rules.validate(&json!({"spec": {"pools": pools, "taskservs": taskservs}}), None));
        assert!(m.iter().any(|x| x.contains("call cost exceeds limit")), "{m:?}");
        // A range that is no field path is assumed as long as the whole value.
        let s = json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
            "x-kubernetes-validations": [{"rule": "(self.a + self.a).all(x, (self.a + self.a).all(y, (self.a + self.a).all(z, x + y + z >= 0)))"}]});
        let rules = Rules::from_schema(&s);
        let a: Vec<i64> = (0..150).collect();
        let m = msgs(&rules.validate(&json!({"a": a}), None));
        assert!(m.iter().any(|x| x.contains("call cost exceeds limit")), "{m:?}");
    }

    #[test]
    fn quadratic_rule_within_the_limit_runs() {
        let rules = Rules::from_schema(&schema());
        let pools: Vec<Value> = (0..200).map(|i| json!({"name": format!("p{i}"), "size": 1})).collect();
        let obj = json!({"spec": {"pools": pools}});
        let m = msgs(&rules.validate(&obj, None));
        assert!(m.iter().all(|x| !x.contains("unique")), "{m:?}");
    }
}
