//! List prices of the plans each provider maps, and the decimal arithmetic around them.
//!
//! Prices are list prices copied from the providers' public pricing pages on the date next to
//! each table; they may be stale (providers change prices, taxes and discounts are not in
//! them). A plan, region or zone missing from a table has no price: the lookup says so and
//! never guesses. Amounts are integer micro-units (10⁻⁶ of the currency) so that nothing is
//! rounded on the way; they are written to the API as decimal strings.

/// Hours in a billing month (365 × 24 / 12), as AWS's own monthly estimates use.
pub const HOURS_PER_MONTH: u64 = 730;

/// Micro-units per currency unit.
pub const MICROS: u64 = 1_000_000;

/// The list price of one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Price {
    /// ISO 4217 code: USD, EUR.
    pub currency: &'static str,
    /// Price per hour, micro-units.
    pub hourly_micros: u64,
    /// Price per month, micro-units (`hourly × 730`, or the provider's monthly cap).
    pub monthly_micros: u64,
    /// Where the figure comes from.
    pub source: String,
    /// The date the list price was taken (YYYY-MM-DD).
    pub as_of: &'static str,
}

impl Price {
    /// A price billed per hour: the month is `hourly × 730`.
    fn hourly(currency: &'static str, hourly_micros: u64, source: String, as_of: &'static str) -> Self {
        Price { currency, hourly_micros, monthly_micros: hourly_micros * HOURS_PER_MONTH, source, as_of }
    }

    /// No charge (machines on the controller's own host, simulated machines).
    fn free(source: &str) -> Self {
        Price { currency: "USD", hourly_micros: 0, monthly_micros: 0, source: source.to_string(), as_of: "" }
    }
}

/// Why a machine has no price: a sentence for status and messages.
pub type NoPrice = String;

/// AWS: the date the table below was taken.
pub const AWS_PRICES_AS_OF: &str = "2025-01-15";
/// AWS: where the table below comes from.
pub const AWS_PRICES_SOURCE: &str = "AWS EC2 On-Demand pricing page (Linux, shared tenancy)";

/// AWS EC2 On-Demand Linux prices (USD per hour, micro-units) of the instance types the
/// abstract plans map to (`t3.small`, `t3.medium`, `t3.large`, `t3.xlarge`), per region.
/// Source: AWS EC2 On-Demand pricing page, prices as of 2025-01-15 (T3 list prices have not
/// changed since the family launched). Regions not listed have no price.
pub const AWS_PRICES: [(&str, [u64; 4]); 13] = [
    ("us-east-1", [20_800, 41_600, 83_200, 166_400]),
    ("us-east-2", [20_800, 41_600, 83_200, 166_400]),
    ("us-west-1", [24_800, 49_600, 99_200, 198_400]),
    ("us-west-2", [20_800, 41_600, 83_200, 166_400]),
    ("ca-central-1", [23_200, 46_400, 92_800, 185_600]),
    ("eu-west-1", [22_800, 45_600, 91_200, 182_400]),
    ("eu-west-2", [23_600, 47_200, 94_400, 188_800]),
    ("eu-west-3", [23_600, 47_200, 94_400, 188_800]),
    ("eu-central-1", [24_000, 48_000, 96_000, 192_000]),
    ("eu-north-1", [21_600, 43_200, 86_400, 172_800]),
    ("ap-northeast-1", [27_200, 54_400, 108_800, 217_600]),
    ("ap-southeast-1", [26_400, 52_800, 105_600, 211_200]),
    ("ap-southeast-2", [26_400, 52_800, 105_600, 211_200]),
];

/// The instance types the columns of [`AWS_PRICES`] are for.
pub const AWS_PRICED_TYPES: [&str; 4] = ["t3.small", "t3.medium", "t3.large", "t3.xlarge"];

/// The list price of an EC2 instance type in a region.
pub fn aws(region: &str, instance_type: &str) -> Result<Price, NoPrice> {
    let Some(column) = AWS_PRICED_TYPES.iter().position(|t| *t == instance_type) else {
        return Err(format!(
            "no list price for EC2 instance type {instance_type:?}: the price table covers {} only",
            AWS_PRICED_TYPES.join(", ")
        ));
    };
    let Some((_, row)) = AWS_PRICES.iter().find(|(r, _)| *r == region) else {
        return Err(format!("no list price for region {region:?}: the AWS price table covers {}", aws_regions().join(", ")));
    };
    let source = format!("{AWS_PRICES_SOURCE}, {instance_type} in {region}");
    Ok(Price::hourly("USD", row[column], source, AWS_PRICES_AS_OF))
}

fn aws_regions() -> Vec<&'static str> {
    AWS_PRICES.iter().map(|(r, _)| *r).collect()
}

/// UpCloud: the date the table below was taken.
pub const UPCLOUD_PRICES_AS_OF: &str = "2025-01-15";
/// UpCloud: where the table below comes from.
pub const UPCLOUD_PRICES_SOURCE: &str = "UpCloud pricing page (General Purpose plans)";
/// UpCloud bills hourly up to the monthly price: the hourly rate is the monthly price over
/// 672 hours (28 days), and a month never costs more than the monthly price.
pub const UPCLOUD_HOURS_PER_MONTH_CAP: u64 = 672;

/// UpCloud General Purpose plans: monthly list price in EUR (micro-units), the same in every
/// public zone. Source: UpCloud pricing page, prices as of 2025-01-15.
pub const UPCLOUD_PRICES: [(&str, u64); 5] = [
    ("1xCPU-1GB", 7 * MICROS),
    ("1xCPU-2GB", 13 * MICROS),
    ("2xCPU-4GB", 26 * MICROS),
    ("4xCPU-8GB", 52 * MICROS),
    ("6xCPU-16GB", 96 * MICROS),
];

/// The list price of an UpCloud plan in a zone (`zones`: the public zones).
pub fn upcloud(zone: &str, plan: &str, zones: &[&str]) -> Result<Price, NoPrice> {
    if !zones.contains(&zone) {
        return Err(format!("no list price for zone {zone:?}: not a public UpCloud zone"));
    }
    let Some((_, monthly)) = UPCLOUD_PRICES.iter().find(|(p, _)| *p == plan) else {
        let known: Vec<&str> = UPCLOUD_PRICES.iter().map(|(p, _)| *p).collect();
        return Err(format!("no list price for UpCloud plan {plan:?}: the price table covers {} only", known.join(", ")));
    };
    // Rounded to the 4 decimals UpCloud shows.
    let hourly = (monthly / UPCLOUD_HOURS_PER_MONTH_CAP + 50) / 100 * 100;
    Ok(Price {
        currency: "EUR",
        hourly_micros: hourly,
        monthly_micros: *monthly,
        source: format!("{UPCLOUD_PRICES_SOURCE}, {plan} in {zone}"),
        as_of: UPCLOUD_PRICES_AS_OF,
    })
}

/// AWS EBS: where the disk table below comes from.
pub const AWS_DISK_PRICES_SOURCE: &str = "AWS EBS pricing page (volume storage, per GB-month)";

/// AWS EBS volume storage, USD per GB-month (micro-units) by volume type, in the regions
/// where these list prices hold (US East N. Virginia and Ohio, US West Oregon). Source: AWS
/// EBS pricing page, prices as of 2025-01-15. io1/io2 provisioned IOPS and gp3 IOPS or
/// throughput above the baseline are billed on top (the controller asks for neither). Other
/// regions have no disk price here (their figures differ; none is guessed).
pub const AWS_DISK_PRICES: [(&str, u64); 6] =
    [("gp3", 80_000), ("gp2", 100_000), ("io1", 125_000), ("io2", 125_000), ("st1", 45_000), ("sc1", 15_000)];
/// The regions [`AWS_DISK_PRICES`] holds for.
pub const AWS_DISK_PRICED_REGIONS: [&str; 3] = ["us-east-1", "us-east-2", "us-west-2"];

/// The list price of an EBS volume of `size_gib` of `volume_type` (empty: gp3) in a region.
pub fn aws_disk(region: &str, volume_type: &str, size_gib: u64) -> Result<Price, NoPrice> {
    let volume_type = if volume_type.is_empty() { "gp3" } else { volume_type };
    if !AWS_DISK_PRICED_REGIONS.contains(&region) {
        return Err(format!("no EBS list price for region {region:?}: the disk table covers {}", AWS_DISK_PRICED_REGIONS.join(", ")));
    }
    let Some((_, per_gib)) = AWS_DISK_PRICES.iter().find(|(t, _)| *t == volume_type) else {
        return Err(format!("no EBS list price for volume type {volume_type:?}"));
    };
    let monthly = per_gib.saturating_mul(size_gib);
    Ok(Price {
        currency: "USD",
        hourly_micros: monthly / HOURS_PER_MONTH,
        monthly_micros: monthly,
        source: format!("{AWS_DISK_PRICES_SOURCE}, {volume_type} in {region}"),
        as_of: AWS_PRICES_AS_OF,
    })
}

/// UpCloud storage: where the table below comes from.
pub const UPCLOUD_DISK_PRICES_SOURCE: &str = "UpCloud API price list (GET /1.3/price, storage_maxiops and storage_hdd per GiB-hour)";

/// UpCloud storage, EUR per GiB-hour (micro-units) by tier: MaxIOPS 0.028 and HDD 0.013
/// cents, as UpCloud's published price list (`GET /1.3/price`, API documentation section 4)
/// gives them; a month is capped at [`UPCLOUD_HOURS_PER_MONTH_CAP`] hours like a plan. The
/// `standard` tier has no price there (none is guessed).
pub const UPCLOUD_DISK_PRICES: [(&str, u64); 2] = [("maxiops", 280), ("hdd", 130)];

/// The list price of an UpCloud storage of `size_gib` of `tier` (empty: maxiops) in a zone.
pub fn upcloud_disk(zone: &str, tier: &str, size_gib: u64, zones: &[&str]) -> Result<Price, NoPrice> {
    let tier = if tier.is_empty() { "maxiops" } else { tier };
    if !zones.contains(&zone) {
        return Err(format!("no storage list price for zone {zone:?}: not a public UpCloud zone"));
    }
    let Some((_, per_gib_hour)) = UPCLOUD_DISK_PRICES.iter().find(|(t, _)| *t == tier) else {
        return Err(format!("no list price for UpCloud storage tier {tier:?}: the table covers maxiops, hdd"));
    };
    let hourly = per_gib_hour.saturating_mul(size_gib);
    Ok(Price {
        currency: "EUR",
        hourly_micros: hourly,
        monthly_micros: hourly.saturating_mul(UPCLOUD_HOURS_PER_MONTH_CAP),
        source: format!("{UPCLOUD_DISK_PRICES_SOURCE}, {tier} in {zone}"),
        as_of: UPCLOUD_PRICES_AS_OF,
    })
}

/// A machine's price with its disks': the machine's `Price` plus each disk priced by
/// `disk` (same currency). A disk without a price (or in another currency) is left out, and
/// the source says so: the machine's own price is still known.
pub fn with_disks(machine: Price, disks: impl IntoIterator<Item = Result<Price, NoPrice>>) -> Price {
    let mut total = machine;
    let mut missing = Vec::new();
    let mut priced = 0;
    for disk in disks {
        match disk {
            Ok(d) if d.currency == total.currency => {
                total.hourly_micros = total.hourly_micros.saturating_add(d.hourly_micros);
                total.monthly_micros = total.monthly_micros.saturating_add(d.monthly_micros);
                priced += 1;
            }
            Ok(d) => missing.push(format!("a disk priced in {}", d.currency)),
            Err(why) => missing.push(why),
        }
    }
    if priced > 0 {
        total.source.push_str(&format!("; {priced} disk(s) included"));
    }
    if !missing.is_empty() {
        total.source.push_str(&format!("; disks not included: {}", missing.join("; ")));
    }
    total
}

/// The local provider: containers on the controller's host cost nothing extra.
pub fn local() -> Price {
    Price::free("local provider: containers on the controller's host, no charge")
}

/// The simulated provider: nothing is billed.
pub fn simulated() -> Price {
    Price::free("simulated provider: no charge")
}

/// AWS: the hourly charge of a public IPv4 address (an Elastic IP, associated or not), USD
/// micro-units. Source: Amazon VPC pricing page, "Public IPv4 Address" ($0.005 per IP per
/// hour, every region, since 2024-02-01).
pub const AWS_PUBLIC_IPV4_HOURLY: u64 = 5_000;

/// The list price of an AWS Elastic IP (see [`AWS_PUBLIC_IPV4_HOURLY`]).
pub fn aws_public_ipv4() -> Price {
    Price::hourly("USD", AWS_PUBLIC_IPV4_HOURLY, "Amazon VPC pricing page (Public IPv4 Address, $0.005/h)".into(), "2024-02-01")
}

/// UpCloud: where the floating IP price comes from. UpCloud's price list (`GET /1.3/price`)
/// has no item of its own for floating IPs: a floating IP is an additional public IPv4
/// address, and UpCloud's Networking documentation (upcloud.com/resources/docs/networking,
/// "Pricing") says that plans include one public IPv4 address and "any additional addresses
/// are priced at €3.15 per month".
pub const UPCLOUD_FLOATING_IP_SOURCE: &str = "UpCloud Networking documentation (additional public IPv4 address, €3.15/month)";
/// The date that figure was read.
pub const UPCLOUD_FLOATING_IP_AS_OF: &str = "2026-11-27";
/// UpCloud: monthly price of an additional public IPv4 address (a floating IP), EUR
/// micro-units, billed hourly up to it like a plan (see [`UPCLOUD_HOURS_PER_MONTH_CAP`]).
pub const UPCLOUD_FLOATING_IP_MONTHLY: u64 = 3_150_000;

/// The list price of an UpCloud floating IP in a zone (`zones`: the public zones).
pub fn upcloud_floating_ip(zone: &str, zones: &[&str]) -> Result<Price, NoPrice> {
    if !zones.contains(&zone) {
        return Err(format!("no floating IP list price for zone {zone:?}: not a public UpCloud zone"));
    }
    Ok(Price {
        currency: "EUR",
        // Rounded to the 4 decimals UpCloud shows, as a plan's.
        hourly_micros: (UPCLOUD_FLOATING_IP_MONTHLY / UPCLOUD_HOURS_PER_MONTH_CAP + 50) / 100 * 100,
        monthly_micros: UPCLOUD_FLOATING_IP_MONTHLY,
        source: format!("{UPCLOUD_FLOATING_IP_SOURCE}, in {zone}"),
        as_of: UPCLOUD_FLOATING_IP_AS_OF,
    })
}

/// Parses a non-negative decimal amount ("12", "12.5", "0.0216") into micro-units. At most 6
/// decimals and 12 integer digits; anything else (signs, exponents, spaces) is `None`.
pub fn parse_amount(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 12 || !digits(whole) || fraction.len() > 6 || !digits(fraction) {
        return None;
    }
    if text.contains('.') && fraction.is_empty() {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let padded = format!("{fraction:0<6}");
    let fraction: u64 = padded.parse().ok()?;
    whole.checked_mul(MICROS)?.checked_add(fraction)
}

/// Writes micro-units as a decimal with at least `min_decimals` and at most 6 decimals
/// (trailing zeros beyond `min_decimals` dropped): `format_amount(21_600, 2)` is "0.0216".
pub fn format_amount(micros: u64, min_decimals: usize) -> String {
    let whole = micros / MICROS;
    let mut fraction = format!("{:06}", micros % MICROS);
    while fraction.len() > min_decimals && fraction.ends_with('0') {
        fraction.pop();
    }
    if fraction.is_empty() { whole.to_string() } else { format!("{whole}.{fraction}") }
}

/// Rounds micro-units to cents (half up) and writes them with two decimals: "15.77".
pub fn format_cents(micros: u64) -> String {
    let cents = micros.saturating_add(5_000) / 10_000;
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// A short amount for humans: "$15.77", "€13.00", "CHF 4.00".
pub fn display(currency: &str, micros: u64) -> String {
    let amount = format_cents(micros);
    match currency {
        "USD" => format!("${amount}"),
        "EUR" => format!("€{amount}"),
        "GBP" => format!("£{amount}"),
        other => format!("{other} {amount}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_add_their_price_per_gib_month() {
        let machine = aws("us-east-1", "t3.small").expect("priced");
        let disk = aws_disk("us-east-1", "", 100).expect("gp3 priced");
        assert_eq!((disk.currency, disk.monthly_micros), ("USD", 8_000_000), "100 GiB gp3 at $0.08");
        let total = with_disks(machine.clone(), [Ok(disk), aws_disk("eu-north-1", "gp3", 10)]);
        assert_eq!(total.monthly_micros, machine.monthly_micros + 8_000_000);
        assert!(total.source.contains("1 disk(s) included") && total.source.contains("eu-north-1"), "{}", total.source);
        assert!(aws_disk("us-east-1", "standard", 1).is_err());
        let maxiops = upcloud_disk("fi-hel1", "", 100, &["fi-hel1"]).expect("priced");
        assert_eq!((maxiops.currency, maxiops.hourly_micros, maxiops.monthly_micros), ("EUR", 28_000, 18_816_000));
        assert!(upcloud_disk("fi-hel1", "standard", 1, &["fi-hel1"]).is_err());
    }

    #[test]
    fn aws_prices_by_region_and_type() {
        let p = aws("eu-north-1", "t3.small").expect("priced");
        assert_eq!((p.currency, p.hourly_micros, p.monthly_micros), ("USD", 21_600, 15_768_000));
        assert_eq!(format_amount(p.hourly_micros, 2), "0.0216");
        assert_eq!(format_cents(p.monthly_micros), "15.77");
        assert!(p.source.contains("eu-north-1") && p.as_of == AWS_PRICES_AS_OF, "{p:?}");
        assert_eq!(aws("us-east-1", "t3.xlarge").map(|p| p.hourly_micros), Ok(166_400));
        // Every row is ordered small < medium < large < xlarge, each about double the last.
        for (region, row) in AWS_PRICES {
            assert!(row.windows(2).all(|w| w[1] == 2 * w[0]), "{region}: {row:?}");
        }
    }

    #[test]
    fn unknown_region_or_type_has_no_price() {
        let region = aws("mars-north-1", "t3.small").expect_err("unknown region");
        assert!(region.contains("mars-north-1") && region.contains("eu-north-1"), "{region}");
        let native = aws("eu-north-1", "m7i.2xlarge").expect_err("unpriced type");
        assert!(native.contains("m7i.2xlarge") && native.contains("t3.small"), "{native}");
    }

    #[test]
    fn an_upcloud_floating_ip_is_an_additional_ipv4_address() {
        let p = upcloud_floating_ip("de-fra1", &["de-fra1"]).expect("priced");
        assert_eq!((p.currency, p.monthly_micros, format_amount(p.hourly_micros, 2)), ("EUR", 3_150_000, "0.0047".into()));
        assert!(upcloud_floating_ip("xx-abc1", &["de-fra1"]).is_err());
    }

    #[test]
    fn upcloud_monthly_list_price_caps_hourly_billing() {
        let zones = ["fi-hel1", "de-fra1"];
        let p = upcloud("de-fra1", "1xCPU-2GB", &zones).expect("priced");
        assert_eq!((p.currency, p.monthly_micros), ("EUR", 13_000_000));
        assert_eq!(format_amount(p.hourly_micros, 2), "0.0193");
        assert_eq!(upcloud("fi-hel1", "1xCPU-1GB", &zones).map(|p| format_amount(p.hourly_micros, 2)), Ok("0.0104".into()));
        assert!(upcloud("xx-abc1", "1xCPU-2GB", &zones).is_err());
        assert!(upcloud("fi-hel1", "HIMEM-4xCPU-32GB", &zones).expect_err("unpriced").contains("HIMEM-4xCPU-32GB"));
    }

    #[test]
    fn local_and_simulated_are_free() {
        assert_eq!(local().monthly_micros, 0);
        assert_eq!(simulated().hourly_micros, 0);
    }

    #[test]
    fn decimal_amounts_parse_exactly_and_refuse_anything_else() {
        assert_eq!(parse_amount("12"), Some(12_000_000));
        assert_eq!(parse_amount("12.5"), Some(12_500_000));
        assert_eq!(parse_amount("0.0216"), Some(21_600));
        assert_eq!(parse_amount("0.000001"), Some(1));
        for bad in ["", "-1", "+1", "1.", ".5", "1e3", " 1", "1,5", "1.0000001", "abc", "1.2.3", "9999999999999"] {
            assert_eq!(parse_amount(bad), None, "{bad:?}");
        }
        assert_eq!(format_amount(0, 2), "0.00");
        assert_eq!(format_amount(12_000_000, 2), "12.00");
        assert_eq!(format_amount(166_400, 2), "0.1664");
        assert_eq!(format_cents(15_184_000), "15.18");
        assert_eq!(format_cents(15_185_000), "15.19");
        assert_eq!(display("USD", 15_768_000), "$15.77");
        assert_eq!(display("EUR", 13_000_000), "€13.00");
        assert_eq!(display("SEK", 1_000_000), "SEK 1.00");
    }
}
