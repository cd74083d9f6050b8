//! Name resolution for push requests, with `push.deny_networks` applied to every
//! address a host resolves to (a name cannot smuggle a denied address in), and to
//! hosts given as addresses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The denied address ranges.
#[derive(Debug, Clone, Default)]
pub(crate) struct DenyList {
    networks: Arc<[IpNet]>,
}

impl DenyList {
    pub(crate) fn new(networks: Vec<IpNet>) -> Self {
        Self { networks: networks.into() }
    }

    /// Whether `ip` (an IPv4-mapped IPv6 address read as IPv4) is denied.
    pub(crate) fn denies(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.networks.iter().any(|n| n.contains(&ip))
    }

    /// Why a request to `url` is refused before it is sent: its host is an address
    /// in a denied range.
    pub(crate) fn refuses(&self, url: &reqwest::Url) -> Option<String> {
        let ip = match url.host()? {
            url::Host::Ipv4(v4) => IpAddr::V4(v4),
            url::Host::Ipv6(v6) => IpAddr::V6(v6),
            url::Host::Domain(_) => return None,
        };
        self.denies(ip).then(|| format!("{ip} is in push.deny_networks"))
    }
}

/// The system resolver, keeping only allowed addresses.
#[derive(Debug)]
pub(crate) struct Resolver {
    deny: DenyList,
}

impl Resolver {
    pub(crate) fn new(deny: DenyList) -> Self {
        Self { deny }
    }
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let deny = self.deny.clone();
        Box::pin(async move {
            let host = name.as_str();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host, 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found.iter().copied().filter(|a| !deny.denies(a.ip())).collect();
            if allowed.is_empty() && !found.is_empty() {
                return Err(format!("every address of {host} is in push.deny_networks").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_mapped_addresses_and_literal_hosts() {
        let deny = DenyList::new(vec!["127.0.0.0/8".parse().unwrap(), "fe80::/10".parse().unwrap()]);
        assert!(deny.denies("127.0.0.2".parse().unwrap()));
        assert!(deny.denies("::ffff:127.0.0.1".parse().unwrap()), "IPv4-mapped");
        assert!(deny.denies("fe80::1".parse().unwrap()));
        assert!(!deny.denies("10.0.0.1".parse().unwrap()));
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(deny.refuses(&url("http://127.0.0.1:9000/")).unwrap().contains("push.deny_networks"));
        assert!(deny.refuses(&url("http://[fe80::1]/")).is_some());
        assert_eq!(deny.refuses(&url("http://localhost/")), None, "names are checked when resolved");
        assert_eq!(DenyList::default().refuses(&url("http://127.0.0.1/")), None);
    }

    #[tokio::test]
    async fn a_name_resolving_only_to_denied_addresses_fails() {
        let all_v4 = DenyList::new(vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]);
        let name: Name = "localhost".parse().unwrap();
        let err = Resolver::new(all_v4).resolve(name).await.err().expect("denied");
        assert!(err.to_string().contains("push.deny_networks"), "{err}");
        let name: Name = "localhost".parse().unwrap();
        let addrs: Vec<_> = Resolver::new(DenyList::default()).resolve(name).await.unwrap().collect();
        assert!(!addrs.is_empty());
    }
}
