//! Cost (pure): a Server's `status.cost` from its provider's price table, and the totals a
//! Cluster and a Workspace show (the sum over their Servers that have a machine).
//!
//! Amounts travel as decimal strings in the API and as integer micro-units here
//! ([`provisioning_providers::prices`]); nothing is a float. Totals never convert between
//! currencies: each currency is summed on its own.

use std::collections::BTreeMap;

use provisioning_crds::{CostAmount, CostTotal, Server, ServerCost};
use provisioning_providers::prices::{self, NoPrice, Price};

/// The COST column of a Server whose cost is unknown.
pub const UNKNOWN: &str = "unknown";

/// The list price of a machine of native plan `plan` in `zone` with its extra `disks`: the
/// plan's price plus each disk's ([`prices::with_disks`]: a disk without a price is left
/// out and the source says so).
pub fn machine_price(
    provider: &(impl provisioning_providers::Provider + ?Sized),
    plan: &str,
    zone: &str,
    disks: &[provisioning_crds::Disk],
) -> Result<Price, NoPrice> {
    let machine = provider.price(plan, zone)?;
    if disks.is_empty() {
        return Ok(machine);
    }
    let disk_prices = disks.iter().map(|d| match d.size_gib() {
        Ok(gib) => provider.disk_price(&d.disk_type, gib, zone),
        Err(e) => Err(format!("disk {:?}: {e}", d.name)),
    });
    Ok(prices::with_disks(machine, disk_prices))
}

/// A Server's `status.cost` from a price lookup.
pub fn server_cost(price: &Result<Price, NoPrice>) -> ServerCost {
    match price {
        Ok(p) => ServerCost {
            currency: p.currency.to_string(),
            hourly: prices::format_amount(p.hourly_micros, 2),
            monthly: prices::format_cents(p.monthly_micros),
            summary: format!("{}/mo", prices::display(p.currency, p.monthly_micros)),
            source: p.source.clone(),
            prices_as_of: p.as_of.to_string(),
            message: String::new(),
        },
        Err(why) => ServerCost { summary: UNKNOWN.into(), message: format!("cost unknown: {why}"), ..Default::default() },
    }
}

/// A known cost as (currency, hourly, monthly) in micro-units; `None` when unknown or unreadable.
pub fn amounts(cost: &ServerCost) -> Option<(&str, u64, u64)> {
    if cost.currency.is_empty() {
        return None;
    }
    Some((cost.currency.as_str(), prices::parse_amount(&cost.hourly)?, prices::parse_amount(&cost.monthly)?))
}

/// Whether the Server has a machine that is billed (its providerID is recorded).
fn billed(server: &Server) -> bool {
    server.status.as_ref().is_some_and(|s| s.provider_id.as_deref().is_some_and(|id| !id.is_empty()))
}

/// The total over the Servers that have a machine; Servers without one cost nothing yet.
pub fn total<'a>(servers: impl IntoIterator<Item = &'a Server>) -> CostTotal {
    total_of(
        servers
            .into_iter()
            .filter(|s| billed(s))
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.status.as_ref().and_then(|st| st.cost.as_ref()))),
    )
}

/// The total over billed things, each named (for the message naming those of unknown cost)
/// with its cost: a Cluster's Servers with a machine and its control-plane endpoint.
pub fn total_of<'a>(billed: impl IntoIterator<Item = (String, Option<&'a ServerCost>)>) -> CostTotal {
    let mut sums: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let (mut priced, mut unknown) = (0u32, Vec::new());
    for (name, cost) in billed {
        match cost.and_then(amounts) {
            Some((currency, hourly, monthly)) => {
                let sum = sums.entry(currency.to_string()).or_default();
                *sum = (sum.0.saturating_add(hourly), sum.1.saturating_add(monthly));
                priced += 1;
            }
            None => unknown.push(name),
        }
    }
    // Free machines (local, simulated) are "USD 0": they add no currency of their own
    // next to a real one.
    if sums.values().any(|(_, m)| *m > 0) {
        sums.retain(|_, (_, m)| *m > 0);
    }
    // The largest total first.
    let mut ordered: Vec<(String, (u64, u64))> = sums.into_iter().collect();
    ordered.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(&b.0)));
    let mut parts: Vec<String> = ordered.iter().map(|(c, (_, m))| format!("{}/mo", prices::display(c, *m))).collect();
    if !unknown.is_empty() {
        parts.push(format!("{} {UNKNOWN}", unknown.len()));
    }
    let amount = |(currency, (hourly, monthly)): &(String, (u64, u64))| CostAmount {
        currency: currency.clone(),
        hourly: prices::format_amount(*hourly, 2),
        monthly: prices::format_cents(*monthly),
    };
    let first = ordered.first().map(amount).unwrap_or_default();
    let unpriced = unknown.len() as u32;
    unknown.truncate(10);
    CostTotal {
        currency: first.currency,
        hourly: first.hourly,
        monthly: first.monthly,
        other_currencies: ordered.iter().skip(1).map(amount).collect(),
        summary: if parts.is_empty() { "none".into() } else { parts.join(" + ") },
        priced,
        unpriced,
        message: if unknown.is_empty() { String::new() } else { format!("not in the total (cost unknown): {}", unknown.join(", ")) },
    }
}

/// The total of the Servers of `namespace` in `servers` (a watch cache's state).
pub fn namespace_total(namespace: &str, servers: &[std::sync::Arc<Server>]) -> CostTotal {
    total(servers.iter().map(|s| s.as_ref()).filter(|s| s.metadata.namespace.as_deref() == Some(namespace)))
}

#[cfg(test)]
mod tests {
    use provisioning_crds::{ServerSpec, ServerStatus};

    use super::*;

    fn server(name: &str, machine: bool, cost: Option<ServerCost>) -> Server {
        let mut s = Server::new(name, ServerSpec::default());
        s.status = Some(ServerStatus { provider_id: machine.then(|| format!("aws://i-{name}")), cost, ..Default::default() });
        s
    }

    fn aws(region: &str, plan: &str) -> Option<ServerCost> {
        Some(server_cost(&prices::aws(region, plan)))
    }

    #[test]
    fn server_cost_is_decimal_strings_with_source_and_date() {
        let c = aws("eu-north-1", "t3.small").unwrap_or_default();
        assert_eq!((c.currency.as_str(), c.hourly.as_str(), c.monthly.as_str()), ("USD", "0.0216", "15.77"));
        assert_eq!(c.summary, "$15.77/mo");
        assert_eq!(c.prices_as_of, prices::AWS_PRICES_AS_OF);
        let unknown = server_cost(&prices::aws("eu-north-1", "m7i.large"));
        assert_eq!((unknown.summary.as_str(), unknown.currency.as_str(), unknown.monthly.as_str()), (UNKNOWN, "", ""));
        assert!(unknown.message.contains("m7i.large"), "{}", unknown.message);
        assert_eq!(server_cost(&Ok(prices::local())).summary, "$0.00/mo");
    }

    #[test]
    fn a_clusters_endpoint_is_in_its_total_and_named_when_its_price_is_unknown() {
        let machine = aws("eu-north-1", "t3.small");
        let eip = server_cost(&Ok(prices::aws_public_ipv4()));
        assert_eq!((eip.monthly.as_str(), eip.source.contains("Public IPv4")), ("3.65", true));
        let t = total_of([("cp-0".to_string(), machine.as_ref()), ("controlPlaneEndpoint".to_string(), Some(&eip))]);
        assert_eq!((t.monthly.as_str(), t.priced), ("19.42", 2));
        let nlb = server_cost(&Err("no NLB".into()));
        let t = total_of([("cp-0".to_string(), machine.as_ref()), ("controlPlaneEndpoint".to_string(), Some(&nlb))]);
        assert_eq!((t.monthly.as_str(), t.unpriced), ("15.77", 1));
        assert!(t.message.contains("controlPlaneEndpoint"), "{}", t.message);
    }

    #[test]
    fn totals_sum_servers_with_a_machine_per_currency() {
        let servers = [
            server("a", true, aws("eu-north-1", "t3.small")),
            server("b", true, aws("eu-north-1", "t3.medium")),
            server("pending", false, aws("eu-north-1", "t3.xlarge")),
        ];
        let t = total(&servers);
        assert_eq!((t.currency.as_str(), t.hourly.as_str(), t.monthly.as_str()), ("USD", "0.0648", "47.31"));
        assert_eq!((t.summary.as_str(), t.priced, t.unpriced), ("$47.31/mo", 2, 0));
        // Another currency is summed apart, never converted; unknown costs are counted and named.
        let upcloud = Some(server_cost(&prices::upcloud("fi-hel1", "1xCPU-2GB", &["fi-hel1"])));
        let mixed = [
            server("a", true, aws("eu-north-1", "t3.small")),
            server("u", true, upcloud),
            server("odd", true, aws("eu-north-1", "m7i.large")),
            server("fresh", true, None),
        ];
        let t = total(&mixed);
        assert_eq!(t.summary, "$15.77/mo + €13.00/mo + 2 unknown");
        assert_eq!(t.other_currencies, vec![CostAmount { currency: "EUR".into(), hourly: "0.0193".into(), monthly: "13.00".into() }]);
        assert_eq!((t.priced, t.unpriced), (2, 2));
        assert!(t.message.contains("odd") && t.message.contains("fresh"), "{}", t.message);
    }

    #[test]
    fn free_machines_add_no_currency_and_empty_is_none() {
        let local = Some(server_cost(&Ok(prices::local())));
        let t = total(&[server("l", true, local.clone()), server("a", true, aws("us-east-1", "t3.small"))]);
        assert_eq!((t.summary.as_str(), t.other_currencies.len()), ("$15.18/mo", 0));
        assert_eq!(total(&[server("l", true, local)]).summary, "$0.00/mo");
        assert_eq!(total(&[]).summary, "none");
    }
}
