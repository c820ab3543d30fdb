//! The aws provider against moto with an account whose network is mapped per zone
//! (`zoneSubnets`): a VPC and three subnets are made in moto first; a machine in each zone
//! starts in that zone's subnet (DescribeInstances says so), a zone the map does not list and
//! subnets of two VPCs (or a subnet listed under another zone) are refused before any
//! security group or machine is made; `publicIp` false leaves the machine without a public
//! address and true gives it one (moto gives none by default, so the pair shows the switch is
//! sent); `subnetId` alone still places every machine; after the deletes nothing the
//! provider made is left (instances, security groups).

mod support;

use std::collections::BTreeMap;

use provisioning_providers::aws::AwsProvider;
use provisioning_providers::{
    Credentials, DeleteOutcome, MachineState, NetworkSettings, Provider, ProviderConfig, ProviderError, ProviderId, ServerIdentity,
    ServerRequest,
};
use support::ec2_proxy::Ec2Proxy;
use support::moto::Moto;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MOTO_AMI: &str = "ami-1e749f67";
const REGION: &str = "eu-north-1";
const ACCOUNT: &str = "zones";
const ZONES: [&str; 3] = ["eu-north-1a", "eu-north-1b", "eu-north-1c"];

fn config(endpoint: &str, zone_subnets: &BTreeMap<String, String>) -> ProviderConfig {
    ProviderConfig {
        name: ACCOUNT.into(),
        provider_type: "aws".into(),
        region: REGION.into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIAZONESTEST0000001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "zones-test-secret".to_string()),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), MOTO_AMI.to_string())].into(),
        rate_limit: 200,
        network: NetworkSettings {
            ssh_source_cidrs: vec!["203.0.113.7/32".into()],
            zone_subnets: zone_subnets.clone(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn request(uid: &str, zone: &str, public_ip: Option<bool>) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "zones".into(), name: uid.into(), cluster: None },
        plan: "small".into(),
        zone: zone.into(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip,
        disks: Vec::new(),
        host_key: None,
    }
}

/// The text of every `<tag>…</tag>` in `xml`.
fn all(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    xml.split(open.as_str()).skip(1).filter_map(|r| r.split_once(close.as_str()).map(|(v, _)| v.to_string())).collect()
}

fn first(xml: &str, tag: &str) -> Result<String, Box<dyn std::error::Error>> {
    all(xml, tag).into_iter().next().ok_or_else(|| format!("no <{tag}> in {xml}").into())
}

/// A VPC with one subnet per zone in moto: (vpc, zone → subnet).
async fn make_network(
    ec2: &AwsProvider,
    cidr: &str,
    zones: &[&str],
) -> Result<(String, BTreeMap<String, String>), Box<dyn std::error::Error>> {
    let xml = ec2.client().call("CreateVpc", &[("CidrBlock".to_string(), format!("{cidr}.0.0/16"))]).await?;
    let vpc = first(&xml, "vpcId")?;
    let mut subnets = BTreeMap::new();
    for (i, zone) in zones.iter().enumerate() {
        let params = [
            ("VpcId".to_string(), vpc.clone()),
            ("CidrBlock".to_string(), format!("{cidr}.{}.0/24", i + 1)),
            ("AvailabilityZone".to_string(), zone.to_string()),
        ];
        let xml = ec2.client().call("CreateSubnet", &params).await?;
        subnets.insert(zone.to_string(), first(&xml, "subnetId")?);
    }
    Ok((vpc, subnets))
}

/// DescribeInstances of one instance, as moto answers it.
async fn describe(ec2: &AwsProvider, id: &ProviderId) -> Result<String, Box<dyn std::error::Error>> {
    Ok(ec2.client().call("DescribeInstances", &[("InstanceId.1".to_string(), id.native_id().to_string())]).await?)
}

/// Live instances and security groups named as the account's managed group, at moto.
async fn leftovers(ec2: &AwsProvider) -> Result<(usize, usize), Box<dyn std::error::Error>> {
    let live = ec2.list_servers(&[]).await?.into_iter().filter(|o| o.state != MachineState::Terminated).count();
    let params =
        [("Filter.1.Name".to_string(), "group-name".to_string()), ("Filter.1.Value.1".to_string(), format!("provisioning-{ACCOUNT}"))];
    let xml = ec2.client().call("DescribeSecurityGroups", &params).await?;
    let mut groups = all(&xml, "groupId");
    groups.sort();
    groups.dedup();
    Ok((live, groups.len()))
}

async fn delete_until_gone(provider: &dyn Provider, id: &ProviderId, uid: &str) -> TestResult {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match provider.delete_owned(id, uid).await? {
            DeleteOutcome::Gone => return Ok(()),
            DeleteOutcome::InProgress if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            DeleteOutcome::InProgress => return Err(format!("{id} still deleting after 30 s").into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_zone_starts_in_its_subnet_and_an_unlisted_zone_creates_nothing() -> TestResult {
    let moto = Moto::start();
    let proxy = Ec2Proxy::start(&moto.endpoint).await?;
    let admin = AwsProvider::new(&config(&moto.endpoint, &BTreeMap::new()))?;
    let (vpc, subnets) = make_network(&admin, "10.20", &ZONES).await?;
    let provider = AwsProvider::new(&config(&proxy.endpoint, &subnets))?;

    let mut made = Vec::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let uid = format!("zone-{i}");
        let obs = provider.ensure_server(&request(&uid, zone, None)).await?;
        let xml = describe(&admin, &obs.provider_id).await?;
        let subnet = &subnets[*zone];
        assert_eq!(first(&xml, "subnetId")?, *subnet, "{zone}: {xml}");
        assert_eq!(first(&xml, "availabilityZone")?, *zone, "{xml}");
        assert_eq!(first(&xml, "vpcId")?, vpc, "{xml}");
        assert!(subnets.values().filter(|s| *s != subnet).all(|other| !xml.contains(other.as_str())), "{zone}: {xml}");
        made.push((obs.provider_id, uid));
    }
    // One managed group, in the subnets' VPC, for all three.
    let (_, groups) = leftovers(&admin).await?;
    assert_eq!(groups, 1);
    // The subnets were checked once (one DescribeSubnets for all of them).
    assert_eq!(proxy.seen("DescribeSubnets"), 1);

    // A zone the map does not list: refused naming the field, nothing created.
    let (runs, creates) = (proxy.seen("RunInstances"), proxy.seen("CreateSecurityGroup"));
    let fresh = AwsProvider::new(&config(&proxy.endpoint, &subnets))?;
    let err = fresh.ensure_server(&request("outside", "eu-west-1a", None)).await.err().ok_or("an unlisted zone was accepted")?;
    assert!(
        matches!(&err, ProviderError::InvalidRequest(m) if m.contains("zoneSubnets") && m.contains("eu-west-1a") && m.contains("eu-north-1b")),
        "{err:?}"
    );
    assert_eq!((proxy.seen("RunInstances"), proxy.seen("CreateSecurityGroup"), proxy.seen("DescribeSubnets")), (runs, creates, 1));

    for (id, uid) in &made {
        delete_until_gone(&provider, id, uid).await?;
    }
    assert_eq!(leftovers(&admin).await?, (0, 0), "no instance and no managed security group left");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subnets_of_two_vpcs_or_in_another_zone_are_refused_before_anything_is_made() -> TestResult {
    let moto = Moto::start();
    let proxy = Ec2Proxy::start(&moto.endpoint).await?;
    let admin = AwsProvider::new(&config(&moto.endpoint, &BTreeMap::new()))?;
    let (_, one) = make_network(&admin, "10.30", &ZONES[..1]).await?;
    let (_, two) = make_network(&admin, "10.40", &ZONES[1..2]).await?;
    let mixed: BTreeMap<String, String> = one.clone().into_iter().chain(two.clone()).collect();
    let provider = AwsProvider::new(&config(&proxy.endpoint, &mixed))?;
    let err = provider.ensure_server(&request("mixed", ZONES[0], None)).await.err().ok_or("two VPCs were accepted")?;
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("more than one VPC")), "{err:?}");

    // eu-north-1b's subnet listed under eu-north-1a.
    let swapped: BTreeMap<String, String> = [(ZONES[0].to_string(), two[ZONES[1]].clone())].into();
    let provider = AwsProvider::new(&config(&proxy.endpoint, &swapped))?;
    let err = provider.ensure_server(&request("swapped", ZONES[0], None)).await.err().ok_or("a subnet in another zone was accepted")?;
    assert!(
        matches!(&err, ProviderError::InvalidRequest(m) if m.contains("listed for zone eu-north-1a") && m.contains("eu-north-1b")),
        "{err:?}"
    );

    // A subnet that does not exist.
    let missing: BTreeMap<String, String> = [(ZONES[0].to_string(), "subnet-0123456789abcdef0".to_string())].into();
    let provider = AwsProvider::new(&config(&proxy.endpoint, &missing))?;
    let err = provider.ensure_server(&request("missing", ZONES[0], None)).await.err().ok_or("a missing subnet was accepted")?;
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("does not exist")), "{err:?}");

    assert_eq!((proxy.seen("RunInstances"), proxy.seen("CreateSecurityGroup")), (0, 0), "nothing created");
    assert_eq!(leftovers(&admin).await?, (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_ip_false_gives_no_public_address_and_true_gives_one() -> TestResult {
    let moto = Moto::start();
    let admin = AwsProvider::new(&config(&moto.endpoint, &BTreeMap::new()))?;
    let (_, subnets) = make_network(&admin, "10.50", &ZONES).await?;
    let provider = AwsProvider::new(&config(&moto.endpoint, &subnets))?;

    let private = provider.ensure_server(&request("private", ZONES[1], Some(false))).await?;
    let public = provider.ensure_server(&request("public", ZONES[1], Some(true))).await?;
    let xml = describe(&admin, &private.provider_id).await?;
    assert!(all(&xml, "ipAddress").is_empty() && !private.addresses.iter().any(|a| a.kind == "ExternalIP"), "{xml}");
    // Subnet and managed group went with the interface (EC2 refuses them beside it).
    assert_eq!(first(&xml, "subnetId")?, subnets[ZONES[1]], "{xml}");
    assert!(xml.contains("provisioning-zones"), "the managed group is on the interface: {xml}");
    let xml = describe(&admin, &public.provider_id).await?;
    assert_eq!(all(&xml, "ipAddress").len(), 1, "{xml}");
    assert!(public.addresses.iter().any(|a| a.kind == "ExternalIP"), "{:?}", public.addresses);

    delete_until_gone(&provider, &private.provider_id, "private").await?;
    delete_until_gone(&provider, &public.provider_id, "public").await?;
    assert_eq!(leftovers(&admin).await?, (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subnet_id_alone_still_places_every_machine() -> TestResult {
    let moto = Moto::start();
    let admin = AwsProvider::new(&config(&moto.endpoint, &BTreeMap::new()))?;
    let (vpc, subnets) = make_network(&admin, "10.60", &ZONES[1..2]).await?;
    let mut cfg = config(&moto.endpoint, &BTreeMap::new());
    cfg.network.subnet_id = subnets[ZONES[1]].clone();
    let provider = AwsProvider::new(&cfg)?;
    let obs = provider.ensure_server(&request("plain", "", None)).await?;
    let xml = describe(&admin, &obs.provider_id).await?;
    assert_eq!((first(&xml, "subnetId")?, first(&xml, "vpcId")?), (subnets[ZONES[1]].clone(), vpc), "{xml}");
    delete_until_gone(&provider, &obs.provider_id, "plain").await?;
    assert_eq!(leftovers(&admin).await?, (0, 0));
    Ok(())
}
