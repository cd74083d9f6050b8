use super::*;

fn load(env: &[(&str, &str)], overrides: Overrides) -> Result<Settings, ConfigError> {
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Settings::load(&overrides, &env)
}

fn error(env: &[(&str, &str)], overrides: Overrides) -> String {
    match load(env, overrides) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shipped_defaults_parse_and_validate() {
    let s = Settings::default();
    s.validate().unwrap();
    assert_eq!(s.server.grpc_addr.port(), 50051);
    assert_eq!(s.server.http_addr.port(), 8080);
    assert_eq!(s.bus_config(), BusConfig { max_channels: 10_000, ..BusConfig::default() });
    assert_eq!(s.eventbus.redis.prefix, "socle:eventbus");
    assert_eq!(s.eventbus.metrics.max_channel_labels, 1000);
    assert_eq!((s.server.idle_timeout_ms, s.server.http.header_read_timeout_ms), (300_000, 10_000));
    assert!(s.server.http.allowed_origins.is_empty());
    assert!(s.server.http.allowed_hosts.is_empty(), "addresses and localhost only");
    assert_eq!(s.auth.default_max_subscriptions, 1000);
}

#[test]
fn push_refuses_loopback_link_local_and_private_addresses_by_default() {
    let s = Settings::default();
    let denied = s.push.denied().unwrap();
    let covered = |ip: &str| denied.iter().any(|n| n.contains(&ip.parse::<std::net::IpAddr>().unwrap()));
    for ip in [
        "127.0.0.1",
        "::1",
        "0.0.0.0",
        "::",
        "169.254.169.254",
        "fe80::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "fd00::1",
        "100.64.0.1",
        "224.0.0.1",
        "ff02::1",
    ] {
        assert!(covered(ip), "{ip}");
    }
    for ip in ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"] {
        assert!(!covered(ip), "{ip}");
    }
    assert!(s.push.allowed().unwrap().is_empty(), "no exception unless asked");
    let s = load(&[("EVENTBUS__PUSH__ALLOW_NETWORKS", "127.0.0.0/8, ::1")], Overrides::default()).unwrap();
    assert_eq!(s.push.allowed().unwrap().len(), 2);
    let err = error(&[("EVENTBUS__PUSH__ALLOW_NETWORKS", "localhost")], Overrides::default());
    assert!(err.contains("push.allow_networks") && err.contains("localhost"), "{err}");
}

#[test]
fn allowed_hosts_are_names_with_an_optional_port_or_a_star() {
    let check = |hosts: &[&str]| {
        let mut s = Settings::default();
        s.server.http.allowed_hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
        s.validate()
    };
    assert!(check(&["eventbus.internal", "bus.example.com:443", "[::1]:8080", "10.0.0.1", "*"]).is_ok());
    for bad in ["https://bus.example.com", "bus.example.com/x", "bus.example.com:http", "*.example.com", "", "a b"] {
        let err = check(&[bad]).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { key: "server.http.allowed_hosts", .. }), "{bad}: {err:?}");
    }
    let s =
        load(&[("EVENTBUS__SERVER__HTTP__ALLOWED_HOSTS", "a.example,b.example:8080")], Overrides::default()).unwrap();
    assert_eq!(s.server.http.allowed_hosts, ["a.example", "b.example:8080"]);
}

#[test]
fn edge_limits_are_checked() {
    let check = |tweak: &dyn Fn(&mut Settings)| {
        let mut s = Settings::default();
        tweak(&mut s);
        s.validate()
    };
    let err = check(&|s| s.server.grpc_stream_window_bytes = 1000).unwrap_err();
    assert!(matches!(err, ConfigError::OutOfRange { key: "server.grpc_stream_window_bytes", .. }), "{err:?}");
    let err = check(&|s| s.server.grpc_connection_window_bytes = u32::MAX).unwrap_err();
    assert!(matches!(err, ConfigError::OutOfRange { key: "server.grpc_connection_window_bytes", .. }), "{err:?}");
    let err = check(&|s| {
        s.server.grpc_stream_window_bytes = 1 << 20;
        s.server.grpc_connection_window_bytes = 1 << 19;
    })
    .unwrap_err();
    assert!(matches!(err, ConfigError::AboveLimit { key: "server.grpc_stream_window_bytes", .. }), "{err:?}");
    let err = check(&|s| s.server.http.header_read_timeout_ms = 0).unwrap_err();
    assert!(matches!(err, ConfigError::TooSmall { key: "server.http.header_read_timeout_ms", .. }), "{err:?}");
    for bad in ["console.example", "https://console.example/", "https://a.example/path", "null", "https://"] {
        let err = check(&|s| s.server.http.allowed_origins = vec![bad.into()]).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { key: "server.http.allowed_origins", .. }), "{bad}: {err:?}");
    }
    let good = check(&|s| {
        s.server.http.allowed_origins = vec!["https://console.example".into(), "http://127.0.0.1:3000".into()];
        s.server.idle_timeout_ms = 0;
    });
    assert!(good.is_ok(), "{good:?}");
}

#[test]
fn precedence_defaults_file_env_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eb.yaml");
    std::fs::write(&file, "eventbus:\n  max_batch: 7\n  offer_timeout_ms: 5\nserver:\n  shutdown_timeout_ms: 9\n")
        .unwrap();
    let overrides = Overrides { config_file: Some(file), grpc_addr: Some("127.0.0.1:1".into()), ..Default::default() };
    let s = load(
        &[
            ("EVENTBUS__EVENTBUS__MAX_BATCH", "8"),
            ("EVENTBUS__SERVER__GRPC_ADDR", "127.0.0.1:2"),
            ("EVENTBUS_QUEUE_CAPACITY", "42"),
        ],
        overrides,
    )
    .unwrap();
    assert_eq!(s.server.shutdown_timeout_ms, 9, "file over defaults");
    assert_eq!(s.eventbus.offer_timeout_ms, 5, "file over defaults");
    assert_eq!(s.eventbus.max_batch, 8, "env over file");
    assert_eq!(s.server.grpc_addr.port(), 1, "flag over env");
    assert_eq!(s.eventbus.default_queue_capacity, 42, "Java-style alias");
}

#[test]
fn canonical_variable_wins_over_alias() {
    let s = load(
        &[("EVENTBUS_QUEUE_CAPACITY", "42"), ("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_CAPACITY", "43")],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(s.eventbus.default_queue_capacity, 43);
    let s = load(&[("EVENTBUS_METRICS_ENABLED", "false"), ("REDIS_PORT", "6380")], Overrides::default()).unwrap();
    assert!(!s.eventbus.metrics.enabled);
    assert_eq!(s.eventbus.redis.port, 6380);
}

#[test]
fn unknown_keys_are_named() {
    let msg = error(&[("EVENTBUS__SERVER__GRPC_ADRR", "x")], Overrides::default());
    assert!(msg.contains("grpc_adrr"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eb.yaml");
    std::fs::write(&file, "eventbus:\n  queue_size: 3\n").unwrap();
    let msg = error(&[], Overrides { config_file: Some(file), ..Default::default() });
    assert!(msg.contains("queue_size"), "{msg}");
}

#[test]
fn bad_values_are_named() {
    let msg = error(&[("EVENTBUS__EVENTBUS__MAX_BATCH", "lots")], Overrides::default());
    assert!(msg.contains("max_batch"), "{msg}");
    let msg = error(&[("EVENTBUS__EVENTBUS__OVERFLOW", "explode")], Overrides::default());
    assert!(msg.contains("overflow"), "{msg}");
    let msg = error(&[], Overrides { grpc_addr: Some("nowhere".into()), ..Default::default() });
    assert!(msg.contains("grpc_addr"), "{msg}");
    let msg = error(&[("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_CAPACITY", "0")], Overrides::default());
    assert!(msg.contains("eventbus.default_queue_capacity"), "{msg}");
    let msg = error(&[("EVENTBUS__EVENTBUS__METRICS__PREFIX", "9bad")], Overrides::default());
    assert!(msg.contains("eventbus.metrics.prefix"), "{msg}");
    let msg = error(&[], Overrides { config_file: Some("/nonexistent.yaml".into()), ..Default::default() });
    assert!(msg.contains("/nonexistent.yaml"), "{msg}");
    let msg = error(&[("EVENTBUS__LOG__FORMAT", "xml")], Overrides::default());
    assert!(msg.contains("format"), "{msg}");
}

#[test]
fn consumers_declared_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eb.yaml");
    let yaml = "durable:\n  data_dir: ''\n  consumers:\n    - name: billing\n      channels: ['orders.>']\n      max_attempts: 3\n";
    std::fs::write(&file, yaml).unwrap();
    let s = load(&[], Overrides { config_file: Some(file.clone()), ..Default::default() }).unwrap();
    let c = s.durable.consumers[0].to_config();
    assert_eq!(
        (c.name.as_str(), c.max_attempts, c.ack_deadline_ms, c.backoff),
        ("billing", 3, 30_000, Backoff::default())
    );
    std::fs::write(&file, "durable:\n  consumers:\n    - name: bad name\n      channels: ['a']\n").unwrap();
    let msg = error(&[], Overrides { config_file: Some(file), ..Default::default() });
    assert!(msg.contains("durable.consumers") && msg.contains("bad name"), "{msg}");
}

/// docs/consumer-operations.md: `exclusive` and `backoff.kind` in `durable.consumers`;
/// a partial `backoff` keeps the other defaults.
#[test]
fn declared_consumers_take_exclusive_and_linear_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eb.yaml");
    let yaml = "durable:\n  consumers:\n    - name: runner\n      channels: ['jobs.>']\n      exclusive: true\n      \
                    backoff: { kind: linear }\n";
    std::fs::write(&file, yaml).unwrap();
    let s = load(&[], Overrides { config_file: Some(file.clone()), ..Default::default() }).unwrap();
    let c = s.durable.consumers[0].to_config();
    assert!(c.exclusive);
    assert_eq!(c.backoff, Backoff { kind: BackoffKind::Linear, ..Backoff::default() });
    std::fs::write(
        &file,
        "durable:\n  consumers:\n    - name: r\n      channels: ['a']\n      backoff: { kind: cubic }\n",
    )
    .unwrap();
    let msg = error(&[], Overrides { config_file: Some(file), ..Default::default() });
    assert!(msg.contains("cubic") && msg.contains("backoff.kind"), "{msg}");
}

/// The Java-style `application.yml` with its defaults written in, minus the
/// Spring `socle:` root, and in redis mode so that every section matters.
const JAVA_STYLE: &str = "\
eventbus:
  enabled: true
  mode: redis
  common:
    default_queue_capacity: 5000
    max_queue_capacity: 20000
    offer_timeout_ms: 250
    overflow: drop_oldest
    max_batch: 64
    max_payload_bytes: 65536
  in_memory:
  redis:
    host: cache
    port: 6380
    password: secret
    database: 2
    prefix: app:bus
    pool:
      max_total: 16
      max_idle: 8
      min_idle: 2
  metrics:
    enabled: false
    prefix: app_bus
";

/// The same settings in the built (flat) layout.
const FLAT: &str = "\
eventbus:
  mode: redis
  default_queue_capacity: 5000
  max_queue_capacity: 20000
  offer_timeout_ms: 250
  overflow: drop_oldest
  max_batch: 64
  max_payload_bytes: 65536
  redis:
    host: cache
    port: 6380
    password: secret
    database: 2
    prefix: app:bus
  metrics:
    enabled: false
    prefix: app_bus
";

fn load_file(text: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eventbus.yaml");
    std::fs::write(&file, text).unwrap();
    load(env, Overrides { config_file: Some(file), ..Default::default() })
}

#[test]
fn seed_shaped_file_gives_the_same_settings_as_the_flat_one() {
    let mut java = load_file(JAVA_STYLE, &[]).unwrap();
    let flat = load_file(FLAT, &[]).unwrap();
    assert_ne!(flat, Settings::default(), "the files change something");
    assert_eq!(
        java.eventbus.redis.pool,
        RedisPoolSettings { max_total: Some(16), max_idle: Some(8), min_idle: Some(2) }
    );
    java.eventbus.redis.pool = RedisPoolSettings::default();
    assert_eq!(java, flat);
    assert!(flat.without_effect().is_empty());
}

#[test]
fn seed_layout_takes_part_in_the_precedence() {
    // A nested key in the file is overridden by the flat variable, and by the Java-style one.
    let s = load_file(JAVA_STYLE, &[("EVENTBUS__EVENTBUS__MAX_BATCH", "9"), ("EVENTBUS_QUEUE_CAPACITY", "7")]).unwrap();
    assert_eq!((s.eventbus.max_batch, s.eventbus.default_queue_capacity), (9, 7));
    // The nested spelling works in EVENTBUS__ variables too, over a flat file.
    let s = load_file(FLAT, &[("EVENTBUS__EVENTBUS__COMMON__MAX_BATCH", "10")]).unwrap();
    assert_eq!(s.eventbus.max_batch, 10);
    // An empty common section, or in_memory: {}, is harmless.
    let s = load_file("eventbus:\n  common:\n  in_memory: {}\n", &[]).unwrap();
    assert_eq!(s, Settings::default());
}

#[test]
fn seed_variables_are_aliases() {
    let env = [
        ("EVENTBUS_ENABLED", "true"),
        ("EVENTBUS_REDIS_POOL_MAX", "32"),
        ("EVENTBUS_REDIS_POOL_MIN_IDLE", "4"),
        ("EVENTBUS_OFFER_TIMEOUT", "50"),
    ];
    let s = load(&env, Overrides::default()).unwrap();
    assert_eq!(s.eventbus.offer_timeout_ms, 50);
    assert_eq!(s.eventbus.redis.pool, RedisPoolSettings { max_total: Some(32), max_idle: None, min_idle: Some(4) });
    let ignored = s.without_effect();
    let names: Vec<_> = ignored.iter().map(|i| (i.key, i.variable, i.value.as_str())).collect();
    assert_eq!(
        names,
        [
            ("eventbus.redis.pool.max_total", "EVENTBUS_REDIS_POOL_MAX", "32"),
            ("eventbus.redis.pool.min_idle", "EVENTBUS_REDIS_POOL_MIN_IDLE", "4"),
        ]
    );
    assert!(ignored[0].reason.contains("no Redis connection pool"));

    let msg = error(&[("EVENTBUS_REDIS_POOL_MAX_IDLE", "-1")], Overrides::default());
    assert!(msg.contains("eventbus.redis.pool.max_idle"), "{msg}");
}

#[test]
fn eventbus_enabled_false_refuses_to_start() {
    for (env, file) in [(&[("EVENTBUS_ENABLED", "false")][..], ""), (&[][..], "eventbus:\n  enabled: off\n")] {
        let err = load_file(file, env).unwrap_err();
        assert!(matches!(err, ConfigError::Disabled), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("eventbus.enabled") && msg.contains("EVENTBUS_ENABLED"), "{msg}");
    }
    // The canonical variable wins over the Java-style one, as for every alias.
    let env = [("EVENTBUS_ENABLED", "false"), ("EVENTBUS__EVENTBUS__ENABLED", "true")];
    assert!(load(&env, Overrides::default()).unwrap().eventbus.enabled);
}

#[test]
fn a_setting_given_both_ways_in_one_layer_is_refused() {
    let err = load_file("eventbus:\n  max_batch: 5\n  common:\n    max_batch: 6\n", &[]).unwrap_err();
    let ConfigError::DuplicateKey { flat, nested, origin } = &err else { panic!("{err:?}") };
    assert_eq!((flat.as_str(), nested.as_str()), ("eventbus.max_batch", "eventbus.common.max_batch"));
    assert!(origin.ends_with("eventbus.yaml"), "{origin}");
    let msg = err.to_string();
    assert!(msg.contains("`eventbus.max_batch`") && msg.contains("`eventbus.common.max_batch`"), "{msg}");

    let env = [("EVENTBUS__EVENTBUS__OVERFLOW", "disconnect"), ("EVENTBUS__EVENTBUS__COMMON__OVERFLOW", "drop_oldest")];
    let msg = error(&env, Overrides::default());
    assert!(msg.contains("eventbus.overflow") && msg.contains("eventbus.common.overflow"), "{msg}");
    assert!(msg.contains("EVENTBUS__"), "names the layer: {msg}");
}

#[test]
fn seed_sections_are_checked() {
    let msg = load_file("eventbus:\n  common:\n    queue_size: 3\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("eventbus.common.queue_size") && msg.contains("`max_batch`"), "{msg}");
    // Keys that only exist flat are not in common.
    let msg = load_file("eventbus:\n  common:\n    max_tracked_channels: 3\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("eventbus.common.max_tracked_channels"), "{msg}");
    let msg = load_file("eventbus:\n  in_memory:\n    shards: 3\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("eventbus.in_memory.shards") && msg.contains("takes no settings"), "{msg}");
    let msg = load_file("eventbus:\n  common: 3\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("eventbus.common") && msg.contains("mapping"), "{msg}");
    let msg = load_file("eventbus:\n  redis:\n    pool:\n      max_wait: 3\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("max_wait"), "{msg}");
}

#[test]
fn errors_about_a_seed_shaped_key_name_it_as_written() {
    // Refused by validate(): the winning value came from the file's common section.
    let err = load_file("eventbus:\n  common:\n    max_batch: 0\n", &[]).unwrap_err();
    assert_eq!(err.key(), Some("eventbus.max_batch"));
    let msg = err.to_string();
    assert!(msg.contains("eventbus.max_batch") && msg.contains("set as `eventbus.common.max_batch`"), "{msg}");
    // Refused by deserialization.
    let msg = load_file("eventbus:\n  common:\n    max_batch: lots\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("max_batch") && msg.contains("eventbus.common.max_batch"), "{msg}");
    // A flat variable over the nested file value: the error is the variable's.
    let msg = load_file("eventbus:\n  common:\n    max_batch: 5\n", &[("EVENTBUS__EVENTBUS__MAX_BATCH", "0")])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("eventbus.max_batch") && !msg.contains("common"), "{msg}");
}

#[test]
fn byte_bounds_are_checked_against_each_other() {
    let err = load(&[("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_BYTES", "1073741824")], Overrides::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::AboveLimit { key: "eventbus.default_queue_bytes", limit_key: "eventbus.max_queued_bytes", .. }
        ),
        "{err:?}"
    );
    let err = load(&[("EVENTBUS__EVENTBUS__MAX_QUEUED_BYTES", "1000")], Overrides::default()).unwrap_err();
    assert!(matches!(err, ConfigError::TooSmall { key: "eventbus.max_queued_bytes", .. }), "{err:?}");
    let s = load(&[], Overrides::default()).unwrap();
    assert_eq!((s.bus_config().default_queue_bytes, s.bus_config().max_queued_bytes), (64 << 20, 512 << 20));
    let redis = s.redis_settings();
    assert_eq!(redis.health_check_interval, Duration::from_secs(1));
    assert_eq!(redis.health_check_timeout, Duration::from_millis(500));
}

#[test]
fn errors_carry_the_key_and_the_value() {
    let err = load(&[("EVENTBUS__EVENTBUS__MAX_BATCH", "0")], Overrides::default()).unwrap_err();
    assert!(
        matches!(err, ConfigError::OutOfRange { key: "eventbus.max_batch", value: 0, min: 1, max: 10_000 }),
        "{err:?}"
    );
    let err = load(
        &[("EVENTBUS__EVENTBUS__DEFAULT_QUEUE_CAPACITY", "11")],
        Overrides { config_file: None, ..Default::default() },
    )
    .and_then(|mut s| {
        s.eventbus.max_queue_capacity = 10;
        s.validate().map(|()| s)
    })
    .unwrap_err();
    assert!(
        matches!(err, ConfigError::AboveLimit { key: "eventbus.default_queue_capacity", value: 11, limit: 10, .. }),
        "{err:?}"
    );
    let err = load(&[("EVENTBUS__LOG__LEVEL", "info,=[")], Overrides::default()).unwrap_err();
    let ConfigError::LogLevel { value, .. } = &err else { panic!("{err:?}") };
    assert_eq!(value, "info,=[");
    assert!(std::error::Error::source(&err).is_some(), "the parse error is the source");
    let err = load(&[("EVENTBUS__EVENTBUS__REDIS__URL", "http://:secret@cache")], Overrides::default()).unwrap_err();
    assert!(matches!(&err, ConfigError::RedisUrlScheme { scheme: Some(s) } if s == "http"), "{err:?}");
    assert!(!err.to_string().contains("secret"), "{err}");
    assert_eq!(
        Mode::try_from("clustered".to_owned()),
        Err(ChoiceError { value: "clustered".into(), expected: &["in_memory", "redis"] })
    );
}

#[test]
fn redis_tls_settings_are_checked() {
    let msg = error(&[("EVENTBUS__EVENTBUS__REDIS__TLS_CA_FILE", "/ca.pem")], Overrides::default());
    assert!(msg.contains("eventbus.redis.tls_ca_file") && msg.contains("rediss://"), "{msg}");
    let env = [
        ("EVENTBUS_MODE", "redis"),
        ("EVENTBUS__EVENTBUS__REDIS__URL", "rediss://cache:6380/"),
        ("EVENTBUS__EVENTBUS__REDIS__TLS_CA_FILE", "/nonexistent/ca.pem"),
    ];
    let msg = error(&env, Overrides::default());
    assert!(msg.contains("eventbus.redis") && msg.contains("/nonexistent/ca.pem"), "{msg}");
    let msg = error(&[("EVENTBUS__EVENTBUS__REDIS__URL", "http://cache")], Overrides::default());
    assert!(msg.contains("eventbus.redis.url"), "{msg}");
}

#[test]
fn list_keys_take_comma_separated_values_from_the_environment() {
    let s = load(
        &[
            ("EVENTBUS__SERVER__HTTP__ALLOWED_ORIGINS", "https://a.example, https://b.example"),
            ("EVENTBUS__AUTH__DEFAULT_PERMISSIONS__PUBLISH__ALLOW", "orders.>"),
            ("EVENTBUS__LOG__LEVEL", "info,eventbus_core=debug"),
        ],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(s.server.http.allowed_origins, ["https://a.example", "https://b.example"]);
    assert_eq!(s.auth.default_permissions.publish.allow, ["orders.>"]);
    assert_eq!(s.log.level, "info,eventbus_core=debug", "other keys keep their commas");
    let s = load(&[("EVENTBUS__SERVER__HTTP__ALLOWED_ORIGINS", "")], Overrides::default()).unwrap();
    assert!(s.server.http.allowed_origins.is_empty(), "an empty value is the empty list");
    let s = load(&[("REDIS_CLUSTER_NODES", "10.0.0.1:7000,10.0.0.2:7000")], Overrides::default()).unwrap();
    assert_eq!(s.eventbus.redis.cluster_nodes, ["10.0.0.1:7000", "10.0.0.2:7000"]);
}

#[test]
fn cluster_nodes_refuse_single_redis_keys_beside_them_and_bad_nodes() {
    let nodes = ("EVENTBUS__EVENTBUS__REDIS__CLUSTER_NODES", "10.0.0.1:7000,10.0.0.2:7000");
    let err = load(&[nodes, ("REDIS_HOST", "cache")], Overrides::default()).unwrap_err();
    assert!(matches!(err, ConfigError::ClusterMix { key: "eventbus.redis.host" }), "{err:?}");
    assert!(err.to_string().contains("eventbus.redis.cluster_nodes"), "{err}");
    let err = load(&[nodes, ("EVENTBUS__EVENTBUS__REDIS__URL", "redis://cache")], Overrides::default()).unwrap_err();
    assert!(matches!(err, ConfigError::ClusterMix { key: "eventbus.redis.url" }), "{err:?}");
    let msg = error(&[("REDIS_CLUSTER_NODES", "10.0.0.1")], Overrides::default());
    assert!(msg.contains("eventbus.redis.cluster_nodes") && msg.contains("host:port"), "{msg}");
    let msg = error(&[("REDIS_CLUSTER_NODES", "redis://a:7000,rediss://b:7000")], Overrides::default());
    assert!(msg.contains("mixes redis:// and rediss://"), "{msg}");
    let msg = error(&[nodes, ("EVENTBUS__EVENTBUS__REDIS__SHARD_TOKENS", "0")], Overrides::default());
    assert!(msg.contains("eventbus.redis.shard_tokens"), "{msg}");
}

#[test]
fn history_rules_load_in_order_and_bad_ones_are_refused_by_name() {
    let yaml = "eventbus:\n  history:\n    - channels: \"orders.>\"\n      ttl_ms: 60000\n    - channels: audit\n      size: 5\n      max_bytes: 1024\n";
    let rules = load_file(yaml, &[]).unwrap().history_rules();
    assert_eq!(rules.rules().len(), 2);
    let orders = HistoryLimits { size: 1000, max_bytes: 16 << 20, ttl: Some(Duration::from_secs(60)) };
    assert_eq!(rules.limits("orders.eu.created"), Some(&orders), "the defaults fill what a rule leaves out");
    assert_eq!(rules.limits("audit"), Some(&HistoryLimits { size: 5, max_bytes: 1024, ttl: None }));
    assert_eq!(rules.limits("other"), None);
    assert!(Settings::default().history_rules().is_empty(), "no history by default");
    for (rule, key) in [
        ("    - channels: \"a..b\"\n", "eventbus.history.channels"),
        ("    - channels: a\n      size: 0\n", "eventbus.history.size"),
        ("    - channels: a\n      max_bytes: 0\n", "eventbus.history.max_bytes"),
        ("    - channels: a\n      sizes: 3\n", "sizes"),
    ] {
        let err = load_file(&format!("eventbus:\n  history:\n{rule}"), &[]).unwrap_err().to_string();
        assert!(err.contains(key), "{rule}: {err}");
    }
}

#[test]
fn push_deny_networks_are_ranges_or_addresses_named_when_wrong() {
    let s =
        load(&[("EVENTBUS__PUSH__DENY_NETWORKS", "127.0.0.0/8, ::1, 169.254.0.0/16")], Overrides::default()).unwrap();
    assert_eq!(s.push.deny_networks, ["127.0.0.0/8", "::1", "169.254.0.0/16"]);
    let denied = s.push.denied().unwrap();
    assert_eq!(denied.len(), 3);
    assert!(denied[1].contains(&"::1".parse::<std::net::IpAddr>().unwrap()), "a single address is a /128");
    let err = error(&[("EVENTBUS__PUSH__DENY_NETWORKS", "10.0.0.0/33")], Overrides::default());
    assert!(err.contains("push.deny_networks") && err.contains("10.0.0.0/33"), "{err}");
    let err = error(&[("EVENTBUS__PUSH__CA_FLIE", "x")], Overrides::default());
    assert!(err.contains("ca_flie"), "{err}");
}

#[test]
fn a_declared_consumer_may_push_and_a_bad_endpoint_names_the_key() {
    let yaml = "durable:\n  consumers:\n    - name: hook\n      channels: ['orders.>']\n      push:\n        url: https://hooks.example.com/x\n        headers: {authorization: 'Bearer t'}\n        envelope: json\n        batch: 10\n";
    let s = load_file(yaml, &[]).unwrap();
    let push = s.durable.consumers[0].to_config().push.unwrap();
    assert_eq!(push.url, "https://hooks.example.com/x");
    assert_eq!((push.batch, push.envelope, push.timeout_ms), (10, eventbus_core::durable::PushEnvelope::Json, 10_000));
    assert_eq!(push.headers["authorization"], "Bearer t");
    let bad = "durable:\n  consumers:\n    - name: hook\n      channels: ['a']\n      push: {url: 'ftp://x/'}\n";
    let err = load_file(bad, &[]).unwrap_err().to_string();
    assert!(err.contains("push.url") && err.contains("hook"), "{err}");
}

#[test]
fn an_unknown_key_from_the_environment_names_the_variable() {
    let msg = error(&[("EVENTBUS__SERVRE__GRPC_ADDR", "127.0.0.1:1")], Overrides::default());
    assert!(msg.contains("servre") && msg.contains("EVENTBUS__SERVRE__GRPC_ADDR"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
    let msg = error(&[("EVENTBUS__SERVER__GRCP_ADDR", "127.0.0.1:1")], Overrides::default());
    assert!(msg.contains("grcp_addr") && msg.contains("EVENTBUS__SERVER__GRCP_ADDR"), "{msg}");
    // A file's unknown key is not blamed on the environment.
    let err = load_file("servre:\n  grpc_addr: 127.0.0.1:1\n", &[]).unwrap_err();
    assert!(!matches!(err, ConfigError::UnknownVariable { .. }), "{err}");
}

#[test]
fn the_data_dir_flag_wins_over_file_and_environment() {
    let env = [("EVENTBUS__DURABLE__DATA_DIR", "from-env/")];
    assert_eq!(load(&env, Overrides::default()).unwrap().durable.data_dir, "from-env/");
    let overrides = Overrides { data_dir: Some("from-flag/".into()), ..Default::default() };
    assert_eq!(load(&env, overrides).unwrap().durable.data_dir, "from-flag/");
}

#[test]
fn the_default_dead_letter_channel_as_shown_reads_back_as_the_default() {
    let yaml = "durable:\n  data_dir: ''\n  consumers:\n    - name: a\n      channels: ['x']\n      dead_letter_channel: 'dlq.<channel>'\n    - name: b\n      channels: ['x']\n      dead_letter_channel: 'dead.b'\n";
    let s = load_file(yaml, &[]).unwrap();
    let configs: Vec<_> = s.durable.consumers.iter().map(|c| c.to_config().dead_letter_channel).collect();
    assert_eq!(configs, [None, Some("dead.b".to_owned())]);
}

#[test]
fn telemetry_settings_are_checked_by_name() {
    let ok = load(&[("EVENTBUS__TELEMETRY__OTLP__ENDPOINT", "http://collector:4317")], Overrides::default()).unwrap();
    assert_eq!(ok.telemetry.otlp.endpoint, "http://collector:4317");
    assert_eq!(ok.telemetry.sampling.ratio, 1.0);
    for (key, value, named) in [
        ("EVENTBUS__TELEMETRY__OTLP__ENDPOINT", "collector:4317", "telemetry.otlp.endpoint"),
        ("EVENTBUS__TELEMETRY__OTLP__ENDPOINT", "ftp://collector", "telemetry.otlp.endpoint"),
        ("EVENTBUS__TELEMETRY__SAMPLING__RATIO", "1.5", "telemetry.sampling.ratio"),
        ("EVENTBUS__TELEMETRY__SAMPLING__RATIO", "-0.1", "telemetry.sampling.ratio"),
        ("EVENTBUS__TELEMETRY__OTLP__EXPORT_INTERVAL_MS", "0", "telemetry.otlp.export_interval_ms"),
        ("EVENTBUS__TELEMETRY__SERVICE_NAME", " ", "telemetry.service_name"),
    ] {
        let msg = error(&[(key, value)], Overrides::default());
        assert!(msg.contains(named), "{key}={value}: {msg}");
    }
}
