//! Which addresses push requests may reach, applied to every address a host resolves
//! to (a name cannot smuggle a refused address in) and to hosts given as addresses:
//!
//! - `push.deny_networks`, unless `push.allow_networks` lets the address through; the
//!   unspecified addresses (`0.0.0.0`, `::`, which connect to this host) and the host's
//!   own addresses count as loopback as well as themselves;
//! - never the broker's own listeners, whatever the lists say: a push consumer posting
//!   to its own broker's publish route multiplies events.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The address rules push requests follow. A cheap handle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reach {
    inner: Arc<Rules>,
}

#[derive(Debug, Default)]
struct Rules {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
    /// The broker's bound listeners.
    listeners: Vec<SocketAddr>,
}

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// In `push.deny_networks` (or loopback-like while loopback is) and not allowed.
    Denied,
    /// One of the broker's own listeners.
    OwnListener,
}

impl Refusal {
    pub(crate) fn explain(self, ip: IpAddr) -> String {
        match self {
            Self::Denied => format!(
                "{ip} is in push.deny_networks and not in push.allow_networks (the host's own and unspecified \
                 addresses count as loopback)"
            ),
            Self::OwnListener => {
                format!("{ip} with this port is one of this broker's own listeners: a push to them would loop")
            }
        }
    }
}

impl Reach {
    pub(crate) fn new(deny: Vec<IpNet>, allow: Vec<IpNet>, listeners: Vec<SocketAddr>) -> Self {
        Self { inner: Arc::new(Rules { deny, allow, listeners }) }
    }

    /// Whether a request may go to `ip` on `port` (`None`: the port is unknown, only
    /// the networks are checked).
    pub(crate) fn check(&self, ip: IpAddr, port: Option<u16>) -> Result<(), Refusal> {
        let ip = canonical(ip);
        let rules = &*self.inner;
        if let Some(port) = port
            && rules.listeners.iter().any(|l| l.port() == port && reaches_listener(ip, canonical(l.ip())))
        {
            return Err(Refusal::OwnListener);
        }
        let blocked =
            |ip: IpAddr| rules.deny.iter().any(|n| n.contains(&ip)) && !rules.allow.iter().any(|n| n.contains(&ip));
        if blocked(ip) {
            return Err(Refusal::Denied);
        }
        let loopback = match ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        if blocked(loopback) && (ip.is_unspecified() || is_own(ip)) {
            return Err(Refusal::Denied);
        }
        Ok(())
    }

    /// Why a request to `url` is refused before it is sent: its host is a refused
    /// address. (Names are checked as they are resolved.)
    pub(crate) fn refuses(&self, url: &reqwest::Url) -> Option<String> {
        let ip = match url.host()? {
            url::Host::Ipv4(v4) => IpAddr::V4(v4),
            url::Host::Ipv6(v6) => IpAddr::V6(v6),
            url::Host::Domain(_) => return None,
        };
        self.check(ip, url.port_or_known_default()).err().map(|r| r.explain(ip))
    }

    /// Whether a URL with this port may resolve onto one of the broker's listeners:
    /// its requests need a resolver that knows the port.
    pub(crate) fn is_listener_port(&self, port: u16) -> bool {
        self.inner.listeners.iter().any(|l| l.port() == port)
    }
}

/// IPv4-mapped IPv6 addresses read as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether a connection to `ip` lands on a listener bound to `bound`: a listener on an
/// unspecified address takes every local address; a connection to an unspecified
/// address goes to loopback.
fn reaches_listener(ip: IpAddr, bound: IpAddr) -> bool {
    let local = ip.is_loopback() || ip.is_unspecified() || is_own(ip);
    if bound.is_unspecified() {
        return local;
    }
    ip == bound || (ip.is_unspecified() && bound.is_loopback())
}

/// Whether `ip` is one of this host's own addresses: only those can be bound.
fn is_own(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// The system resolver, keeping only the addresses `reach` allows (for `port` when
/// known).
#[derive(Debug)]
pub(crate) struct Resolver {
    reach: Reach,
    port: Option<u16>,
}

impl Resolver {
    pub(crate) fn new(reach: Reach, port: Option<u16>) -> Self {
        Self { reach, port }
    }
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let reach = self.reach.clone();
        let port = self.port;
        Box::pin(async move {
            let host = name.as_str();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host, 0)).await?.collect();
            let mut refusal = None;
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| match reach.check(a.ip(), port) {
                    Ok(()) => true,
                    Err(why) => {
                        refusal.get_or_insert((why, a.ip()));
                        false
                    }
                })
                .collect();
            if let (true, Some((why, ip))) = (allowed.is_empty(), refusal) {
                return Err(format!("every address of {host} is refused: {}", why.explain(ip)).into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_cover_mapped_addresses_and_literal_hosts() {
        let reach = Reach::new(nets(&["127.0.0.0/8", "fe80::/10"]), vec![], vec![]);
        assert_eq!(reach.check(ip("127.0.0.2"), None), Err(Refusal::Denied));
        assert_eq!(reach.check(ip("::ffff:127.0.0.1"), None), Err(Refusal::Denied), "IPv4-mapped");
        assert_eq!(reach.check(ip("fe80::1"), None), Err(Refusal::Denied));
        assert_eq!(reach.check(ip("198.51.100.1"), None), Ok(()));
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(reach.refuses(&url("http://127.0.0.1:9000/")).unwrap().contains("push.deny_networks"));
        assert!(reach.refuses(&url("http://[fe80::1]/")).is_some());
        assert_eq!(reach.refuses(&url("http://localhost/")), None, "names are checked when resolved");
        assert_eq!(Reach::default().refuses(&url("http://127.0.0.1/")), None);
    }

    #[test]
    fn unspecified_and_own_addresses_count_as_loopback() {
        let example = Reach::new(nets(&["127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10"]), vec![], vec![]);
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        for u in ["http://0.0.0.0:9000/", "http://0:9000/", "http://[::]:9000/", "http://[::ffff:0.0.0.0]/"] {
            assert!(example.refuses(&url(u)).is_some(), "{u}");
        }
        assert_eq!(example.check(ip("198.51.100.1"), None), Ok(()), "not this host's");
        // The address this host sends from (when it has a route) is its own.
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        if socket.connect("198.51.100.1:9").is_ok()
            && let Ok(local) = socket.local_addr()
            && !local.ip().is_loopback()
        {
            assert_eq!(example.check(local.ip(), None), Err(Refusal::Denied), "{local}");
        }
        let allowed = Reach::new(nets(&["127.0.0.0/8", "0.0.0.0/8"]), nets(&["127.0.0.0/8"]), vec![]);
        assert_eq!(allowed.check(ip("127.0.0.1"), None), Ok(()), "allowed wins over denied");
        assert_eq!(allowed.check(ip("0.0.0.0"), None), Err(Refusal::Denied), "unless itself denied");
    }

    #[test]
    fn the_brokers_own_listeners_are_refused_whatever_the_lists_say() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let reach = Reach::new(vec![], vec![], vec![any, lo]);
        for target in ["127.0.0.1", "127.0.0.1", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1"] {
            assert_eq!(reach.check(ip(target), Some(8080)), Err(Refusal::OwnListener), "{target}");
        }
        assert_eq!(reach.check(ip("127.0.0.1"), Some(50051)), Err(Refusal::OwnListener));
        assert_eq!(reach.check(ip("0.0.0.0"), Some(50051)), Err(Refusal::OwnListener));
        assert_eq!(reach.check(ip("127.0.0.2"), Some(50051)), Ok(()), "a listener on one address takes only it");
        assert_eq!(reach.check(ip("127.0.0.1"), Some(9000)), Ok(()));
        assert_eq!(reach.check(ip("198.51.100.1"), Some(8080)), Ok(()), "another host");
        assert!(reach.is_listener_port(8080) && !reach.is_listener_port(9000));
    }

    #[tokio::test]
    async fn a_name_resolving_only_to_refused_addresses_fails() {
        let loopback = Reach::new(nets(&["127.0.0.0/8", "::1/128"]), vec![], vec![]);
        let name: Name = "localhost".parse().unwrap();
        let err = Resolver::new(loopback, None).resolve(name).await.err().expect("denied");
        assert!(err.to_string().contains("push.deny_networks"), "{err}");
        let name: Name = "localhost".parse().unwrap();
        let addrs: Vec<_> = Resolver::new(Reach::default(), None).resolve(name).await.unwrap().collect();
        assert!(!addrs.is_empty());
        let own = Reach::new(vec![], vec![], vec!["0.0.0.0:8080".parse().unwrap()]);
        let name: Name = "localhost".parse().unwrap();
        let err = Resolver::new(own, Some(8080)).resolve(name).await.err().expect("own listener");
        assert!(err.to_string().contains("own listeners"), "{err}");
    }
}
