//! What the pure planners of TaskServ and Cluster share: the [`PlannedEvent`] they hand back
//! to their reconciler, and the `dependsOn` graph check ([`depends_on_cycle`]) that turns a
//! user-made cycle between objects of one kind into a `Stalled` condition naming the cycle
//! instead of two objects waiting for each other forever.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// An Event a planner wants published on its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    /// Warning or Normal.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// For humans (may carry a script's output tail; never secrets).
    pub note: String,
}

impl PlannedEvent {
    /// A Normal event.
    pub fn normal(reason: &str, note: impl Into<String>) -> Self {
        PlannedEvent { warning: false, reason: reason.into(), note: note.into() }
    }
    /// A Warning event.
    pub fn warning(reason: &str, note: impl Into<String>) -> Self {
        PlannedEvent { warning: true, reason: reason.into(), note: note.into() }
    }
}

/// Reason of `Stalled` when objects' `dependsOn` lists form a cycle.
pub const REASON_DEPENDENCY_CYCLE: &str = "DependencyCycle";
/// Reason of `Ready=False` while a dependency named in `dependsOn` does not exist (waiting:
/// it may still be created).
pub const REASON_DEPENDENCY_MISSING: &str = "DependencyMissing";

/// The shortest `dependsOn` cycle through `own`, as the path `[own, b, …, own]`, if there is
/// one. `graph` maps each object's name to the names its `dependsOn` lists (objects of one kind
/// in one namespace; names that are not keys are missing objects and end a path).
pub fn depends_on_cycle(own: &str, graph: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    // Breadth first from own's dependencies, remembering how each name was reached.
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut queue: VecDeque<&str> = VecDeque::new();
    for dep in graph.get(own).into_iter().flatten() {
        if seen.insert(dep.as_str()) {
            came_from.insert(dep.as_str(), own);
            queue.push_back(dep.as_str());
        }
    }
    while let Some(node) = queue.pop_front() {
        if node == own {
            return Some(path_back(own, &came_from));
        }
        for dep in graph.get(node).into_iter().flatten() {
            if seen.insert(dep.as_str()) {
                came_from.insert(dep.as_str(), node);
                queue.push_back(dep.as_str());
            }
        }
    }
    None
}

/// The path from `own` back to `own` recorded in `came_from` (the last hop's predecessor chain).
fn path_back(own: &str, came_from: &BTreeMap<&str, &str>) -> Vec<String> {
    let mut path = vec![own.to_string()];
    let mut at = came_from.get(own).copied();
    // At most one step per recorded name: the chain always ends at own.
    for _ in 0..=came_from.len() {
        match at {
            Some(n) if n == own => break,
            Some(n) => {
                path.push(n.to_string());
                at = came_from.get(n).copied();
            }
            None => break,
        }
    }
    path.push(own.to_string());
    path.reverse();
    path
}

/// `kind a → b → a`, the wording of a cycle in conditions and events.
pub fn cycle_message(kind: &str, cycle: &[String]) -> String {
    format!("dependsOn cycle: {kind} {}", cycle.join(" → "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        edges.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect()
    }

    #[test]
    fn two_objects_naming_each_other_are_a_cycle_from_either_side() {
        let g = graph(&[("a", &["b"]), ("b", &["a"])]);
        assert_eq!(depends_on_cycle("a", &g), Some(vec!["a".into(), "b".into(), "a".into()]));
        assert_eq!(depends_on_cycle("b", &g), Some(vec!["b".into(), "a".into(), "b".into()]));
    }

    #[test]
    fn longer_cycles_are_named_in_order_and_bystanders_are_not_in_one() {
        let g = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"]), ("e", &["missing"])]);
        assert_eq!(cycle_message("TaskServ", &depends_on_cycle("a", &g).unwrap_or_default()), "dependsOn cycle: TaskServ a → b → c → a");
        assert_eq!(depends_on_cycle("d", &g), None, "d waits for a but is not on the cycle");
        assert_eq!(depends_on_cycle("e", &g), None);
        assert_eq!(depends_on_cycle("nobody", &g), None);
    }

    #[test]
    fn self_reference_and_shortest_cycle() {
        let g = graph(&[("a", &["a"])]);
        assert_eq!(depends_on_cycle("a", &g), Some(vec!["a".into(), "a".into()]));
        let g = graph(&[("a", &["x", "b"]), ("x", &["y"]), ("y", &["a"]), ("b", &["a"])]);
        assert_eq!(depends_on_cycle("a", &g), Some(vec!["a".into(), "b".into(), "a".into()]));
    }
}
