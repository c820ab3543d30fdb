use super::*;

fn item(kind: &'static str, ns: &str, name: &str, label: Option<&str>) -> Item {
    Item {
        kind,
        namespace: (kind != "Workspace").then(|| ns.to_string()),
        name: name.to_string(),
        key: ns.to_string(),
        label: label.map(str::to_string),
        uid: format!("uid-{ns}-{name}"),
        resource_version: Some("1".into()),
    }
}

fn live(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_string()).collect()
}

fn owner_by_ring(members: &[&str], key: &str, keys: &[&str]) -> String {
    ring::assign(members, keys, ring::LOAD_FACTOR).get(key).map(|m| (*m).to_string()).unwrap_or_default()
}

#[test]
fn unlabelled_objects_are_claimed_by_the_ring_owner_only() {
    let items = vec![item("Workspace", "ns-a", "ns-a", None), item("Server", "ns-a", "web", None)];
    let members = ["r1", "r2"];
    let owner = owner_by_ring(&members, "ns-a", &["ns-a"]);
    let other = members.iter().find(|m| **m != owner).copied().unwrap_or_default();
    let claim = plan(&owner, &live(&members), &items, &|_| true);
    assert_eq!(claim.relabels.len(), 2);
    assert!(claim.relabels.iter().all(|r| r.to == owner));
    assert!(claim.open.contains("ns-a"));
    let none = plan(other, &live(&members), &items, &|_| true);
    assert!(none.relabels.is_empty(), "only the ring's owner claims: {none:?}");
}

#[test]
fn a_new_object_goes_to_the_namespace_live_holder_not_the_ring() {
    let members = ["r1", "r2"];
    let owner = owner_by_ring(&members, "ns-a", &["ns-a"]);
    let holder = members.iter().find(|m| **m != owner).copied().unwrap_or_default();
    // The holder still holds the namespace (its hand-over has not happened yet).
    let items = vec![item("Workspace", "ns-a", "ns-a", Some(holder)), item("Server", "ns-a", "new", None)];
    let by_owner = plan(&owner, &live(&members), &items, &|_| true);
    assert!(by_owner.relabels.is_empty(), "the ring's owner waits for the hand-over: {by_owner:?}");
    let busy = plan(holder, &live(&members), &items, &|_| false);
    assert_eq!(busy.relabels, vec![Relabel { index: 1, to: holder.to_string() }], "the holder labels the newcomer itself");
    assert!(busy.drain.contains("ns-a"));
}

#[test]
fn a_holder_hands_over_only_once_drained() {
    let members = ["r1", "r2"];
    let owner = owner_by_ring(&members, "ns-a", &["ns-a"]);
    let holder = members.iter().find(|m| **m != owner).copied().unwrap_or_default();
    let items = vec![item("Workspace", "ns-a", "ns-a", Some(holder)), item("Server", "ns-a", "web", Some(holder))];
    let busy = plan(holder, &live(&members), &items, &|_| false);
    assert!(busy.relabels.is_empty(), "reconciles in flight: no relabel yet");
    assert!(busy.drain.contains("ns-a"));
    let idle = plan(holder, &live(&members), &items, &|_| true);
    assert_eq!(idle.relabels.len(), 2);
    assert!(idle.relabels.iter().all(|r| r.to == owner));
    // Nobody else touches a live holder's objects.
    assert!(plan(&owner, &live(&members), &items, &|_| true).relabels.is_empty());
}

#[test]
fn a_dead_holders_objects_go_to_the_ring_owner_without_acknowledgement() {
    let members = ["r1", "r2"];
    let items = vec![item("Workspace", "ns-a", "ns-a", Some("dead")), item("Server", "ns-a", "web", Some("dead"))];
    let owner = owner_by_ring(&members, "ns-a", &["ns-a"]);
    let claim = plan(&owner, &live(&members), &items, &|_| false);
    assert_eq!(claim.relabels.len(), 2);
    assert!(claim.relabels.iter().all(|r| r.to == owner));
}

#[tokio::test]
async fn a_replica_that_cannot_renew_its_lease_stops_before_it_counts_as_dead() -> Result<(), Box<dyn std::error::Error>> {
    // An API server that refuses every connection: no renewal ever succeeds.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = kube::Config::new(format!("http://{closed}").parse()?);
    let leases: Api<Lease> = Api::namespaced(Client::try_from(config)?, "default");
    let membership = Membership { namespace: "default".into(), duration: Duration::from_secs(4), renew: Duration::from_secs(1) };
    let started = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(10), hold(&leases, "r1", &membership, Duration::from_millis(500))).await?;
    let took = started.elapsed();
    assert!(matches!(lost, ShardError::Lost(ref name) if name == "provisioning-shard-r1"), "{lost:?}");
    // Stops after duration - renew - period (2.5 s), before the Lease may be treated as dead
    // by others (4 s after its last renewal).
    assert!(took >= Duration::from_millis(2500) && took < Duration::from_secs(4), "stopped after {took:?}");
    Ok(())
}
