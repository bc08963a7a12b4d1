//! Addresses no policy may reach: the host's loopback, private and shared
//! networks, link-local (cloud metadata lives there), multicast and the
//! reserved blocks, in IPv4 and IPv6, and IPv4 addresses smuggled inside
//! IPv6 forms (mapped, compatible, NAT64, 6to4).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A block of addresses that is always denied, whatever the policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeniedRange {
    /// 127.0.0.0/8.
    Loopback,
    /// 0.0.0.0/8: "this network"; 0.0.0.0 reaches the host's own services.
    ThisNetwork,
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 (RFC 1918).
    Private,
    /// 100.64.0.0/10, shared address space (RFC 6598); clouds put internal
    /// services there (Alibaba's metadata is 100.100.100.200).
    CarrierGradeNat,
    /// 169.254.0.0/16 (RFC 3927).
    LinkLocal,
    /// 169.254.169.254 and fd00:ec2::254: the cloud instance metadata
    /// services, which hand out credentials.
    CloudMetadata,
    /// 224.0.0.0/4.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 240.0.0.0/4 (future use).
    Reserved,
    /// ::1.
    Ipv6Loopback,
    /// ::.
    Ipv6Unspecified,
    /// fc00::/7, unique local addresses (RFC 4193).
    Ipv6UniqueLocal,
    /// fec0::/10, deprecated site-local addresses (still routed by some
    /// networks).
    Ipv6SiteLocal,
    /// fe80::/10.
    Ipv6LinkLocal,
    /// ff00::/8.
    Ipv6Multicast,
    /// 64:ff9b:1::/48, local-use NAT64 (RFC 8215): its translator may map
    /// it onto private IPv4 space.
    LocalNat64,
}

impl DeniedRange {
    /// Why the range is denied, for people (audit events, error messages).
    pub fn reason(self) -> &'static str {
        match self {
            DeniedRange::Loopback => "loopback (127.0.0.0/8)",
            DeniedRange::ThisNetwork => "\"this network\" (0.0.0.0/8)",
            DeniedRange::Private => "private network (RFC 1918)",
            DeniedRange::CarrierGradeNat => "carrier-grade NAT shared space (100.64.0.0/10)",
            DeniedRange::LinkLocal => "link-local (169.254.0.0/16)",
            DeniedRange::CloudMetadata => "link-local / cloud metadata",
            DeniedRange::Multicast => "multicast (224.0.0.0/4)",
            DeniedRange::Broadcast => "broadcast (255.255.255.255)",
            DeniedRange::Reserved => "reserved (240.0.0.0/4)",
            DeniedRange::Ipv6Loopback => "IPv6 loopback (::1)",
            DeniedRange::Ipv6Unspecified => "IPv6 unspecified address (::)",
            DeniedRange::Ipv6UniqueLocal => "IPv6 unique local (fc00::/7)",
            DeniedRange::Ipv6SiteLocal => "IPv6 site-local (fec0::/10)",
            DeniedRange::Ipv6LinkLocal => "IPv6 link-local (fe80::/10)",
            DeniedRange::Ipv6Multicast => "IPv6 multicast (ff00::/8)",
            DeniedRange::LocalNat64 => "local-use NAT64 (64:ff9b:1::/48)",
        }
    }

    /// A stable snake_case name, for metrics labels and audit fields.
    pub fn code(self) -> &'static str {
        match self {
            DeniedRange::Loopback => "loopback",
            DeniedRange::ThisNetwork => "this_network",
            DeniedRange::Private => "private",
            DeniedRange::CarrierGradeNat => "carrier_grade_nat",
            DeniedRange::LinkLocal => "link_local",
            DeniedRange::CloudMetadata => "cloud_metadata",
            DeniedRange::Multicast => "multicast",
            DeniedRange::Broadcast => "broadcast",
            DeniedRange::Reserved => "reserved",
            DeniedRange::Ipv6Loopback => "ipv6_loopback",
            DeniedRange::Ipv6Unspecified => "ipv6_unspecified",
            DeniedRange::Ipv6UniqueLocal => "ipv6_unique_local",
            DeniedRange::Ipv6SiteLocal => "ipv6_site_local",
            DeniedRange::Ipv6LinkLocal => "ipv6_link_local",
            DeniedRange::Ipv6Multicast => "ipv6_multicast",
            DeniedRange::LocalNat64 => "local_nat64",
        }
    }
}

impl std::fmt::Display for DeniedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

/// The AWS instance metadata service over IPv6.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);
/// The instance metadata service of most clouds over IPv4.
const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// The always-denied range `ip` falls in, if any. IPv6 forms that carry an
/// IPv4 address (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`,
/// translated `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`)
/// are judged by that IPv4 address, since that is where they lead.
pub fn always_denied(ip: IpAddr) -> Option<DeniedRange> {
    match ip {
        IpAddr::V4(v4) => denied_v4(v4),
        IpAddr::V6(v6) => denied_v6(v6),
    }
}

fn denied_v4(ip: Ipv4Addr) -> Option<DeniedRange> {
    let [a, b, ..] = ip.octets();
    let range = match (a, b) {
        _ if ip == METADATA_V4 => DeniedRange::CloudMetadata,
        _ if ip == Ipv4Addr::BROADCAST => DeniedRange::Broadcast,
        (0, _) => DeniedRange::ThisNetwork,
        (10, _) => DeniedRange::Private,
        (100, 64..=127) => DeniedRange::CarrierGradeNat,
        (127, _) => DeniedRange::Loopback,
        (169, 254) => DeniedRange::LinkLocal,
        (172, 16..=31) => DeniedRange::Private,
        (192, 168) => DeniedRange::Private,
        (224..=239, _) => DeniedRange::Multicast,
        (240..=255, _) => DeniedRange::Reserved,
        _ => return None,
    };
    Some(range)
}

fn denied_v6(ip: Ipv6Addr) -> Option<DeniedRange> {
    if let Some(embedded) = embedded_v4(ip) {
        return denied_v4(embedded);
    }
    let s = ip.segments();
    let range = match s[0] {
        _ if ip == Ipv6Addr::LOCALHOST => DeniedRange::Ipv6Loopback,
        _ if ip == Ipv6Addr::UNSPECIFIED => DeniedRange::Ipv6Unspecified,
        _ if ip == AWS_METADATA_V6 => DeniedRange::CloudMetadata,
        0x0064 if s[1] == 0xff9b && s[2] == 0x0001 => DeniedRange::LocalNat64,
        0xfc00..=0xfdff => DeniedRange::Ipv6UniqueLocal,
        0xfe80..=0xfebf => DeniedRange::Ipv6LinkLocal,
        0xfec0..=0xfeff => DeniedRange::Ipv6SiteLocal,
        0xff00..=0xffff => DeniedRange::Ipv6Multicast,
        _ => return None,
    };
    Some(range)
}

/// The IPv4 address an IPv6 address leads to, for the forms that embed one.
/// `::` and `::1` are IPv6's own, not IPv4-compatible addresses.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let low32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        // ::a.b.c.d (compatible, deprecated) but not :: or ::1.
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 || lo > 1 => Some(low32),
        // ::ffff:a.b.c.d (mapped).
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low32),
        // ::ffff:0:a.b.c.d (translated, RFC 2765).
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(low32),
        // 64:ff9b::a.b.c.d (well-known NAT64 prefix, RFC 6052).
        [0x0064, 0xff9b, 0, 0, 0, 0, _, _] => Some(low32),
        // 2002:AABB:CCDD::/48 (6to4, RFC 3056).
        [0x2002, _, _, _, _, _, _, _] => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(text: &str) -> Option<DeniedRange> {
        always_denied(text.parse().unwrap())
    }

    #[test]
    fn ipv4_ranges() {
        use DeniedRange::*;
        let table = [
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("0.0.0.0", Some(ThisNetwork)),
            ("0.1.2.3", Some(ThisNetwork)),
            ("10.0.0.1", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("192.168.1.1", Some(Private)),
            ("192.169.0.1", None),
            ("100.64.0.1", Some(CarrierGradeNat)),
            ("100.127.255.255", Some(CarrierGradeNat)),
            ("100.100.100.200", Some(CarrierGradeNat)),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("169.254.0.1", Some(LinkLocal)),
            ("169.254.169.254", Some(CloudMetadata)),
            ("169.253.0.1", None),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.254", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
            ("1.1.1.1", None),
            ("8.8.8.8", None),
            ("151.101.0.223", None),
            ("223.255.255.255", None),
        ];
        for (ip, expected) in table {
            assert_eq!(judge(ip), expected, "{ip}");
        }
    }

    #[test]
    fn ipv6_ranges() {
        use DeniedRange::*;
        let table = [
            ("::1", Some(Ipv6Loopback)),
            ("::", Some(Ipv6Unspecified)),
            ("fc00::1", Some(Ipv6UniqueLocal)),
            ("fd12:3456::1", Some(Ipv6UniqueLocal)),
            ("fd00:ec2::254", Some(CloudMetadata)),
            ("fd00:ec2::253", Some(Ipv6UniqueLocal)),
            ("fe80::1", Some(Ipv6LinkLocal)),
            ("febf::1", Some(Ipv6LinkLocal)),
            ("fec0::1", Some(Ipv6SiteLocal)),
            ("ff02::1", Some(Ipv6Multicast)),
            ("ff05::1:3", Some(Ipv6Multicast)),
            ("64:ff9b:1::a00:1", Some(LocalNat64)),
            ("2001:4860:4860::8888", None),
            ("2606:4700::1111", None),
            ("fbff::1", None),
        ];
        for (ip, expected) in table {
            assert_eq!(judge(ip), expected, "{ip}");
        }
    }

    #[test]
    fn ipv4_inside_ipv6_is_judged_as_ipv4() {
        use DeniedRange::*;
        let table = [
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:7f00:1", Some(Loopback)),
            ("::127.0.0.1", Some(Loopback)),
            ("::0.0.0.2", Some(ThisNetwork)),
            ("::ffff:0:10.0.0.1", Some(Private)),
            ("64:ff9b::192.168.0.1", Some(Private)),
            ("2002:0a00:0001::1", Some(Private)),
            ("2002:7f00:0001::", Some(Loopback)),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::8.8.8.8", None),
            ("2002:0808:0808::1", None),
        ];
        for (ip, expected) in table {
            assert_eq!(judge(ip), expected, "{ip}");
        }
    }

    #[test]
    fn cloud_metadata_in_every_spelling() {
        let spellings: [IpAddr; 7] = [
            IpAddr::V4(METADATA_V4),
            IpAddr::V6(METADATA_V4.to_ipv6_mapped()),
            IpAddr::V6(METADATA_V4.to_ipv6_compatible()),
            "::ffff:0:169.254.169.254".parse().unwrap(),
            "64:ff9b::a9fe:a9fe".parse().unwrap(),
            "2002:a9fe:a9fe::1".parse().unwrap(),
            IpAddr::V6(AWS_METADATA_V6),
        ];
        for ip in spellings {
            assert_eq!(always_denied(ip), Some(DeniedRange::CloudMetadata), "{ip}");
            assert_eq!(
                always_denied(ip).map(DeniedRange::reason),
                Some("link-local / cloud metadata")
            );
        }
        // From the integer every other spelling (decimal, hex, octal) is
        // read into by `canonical_host`.
        assert_eq!(
            always_denied(IpAddr::V4(Ipv4Addr::from(0xa9fe_a9fe_u32))),
            Some(DeniedRange::CloudMetadata)
        );
    }

    #[test]
    fn codes_are_snake_case_and_distinct() {
        use DeniedRange::*;
        let all = [
            Loopback,
            ThisNetwork,
            Private,
            CarrierGradeNat,
            LinkLocal,
            CloudMetadata,
            Multicast,
            Broadcast,
            Reserved,
            Ipv6Loopback,
            Ipv6Unspecified,
            Ipv6UniqueLocal,
            Ipv6SiteLocal,
            Ipv6LinkLocal,
            Ipv6Multicast,
            LocalNat64,
        ];
        let mut codes: Vec<&str> = all.iter().map(|r| r.code()).collect();
        assert!(codes.iter().all(|c| c
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ch == '_' || ch.is_ascii_digit())));
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
    }
}
