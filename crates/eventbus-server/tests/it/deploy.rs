//! The container, compose and Kubernetes files parse and agree with the configuration
//! keys and ports the daemon really uses. (No Docker engine runs on the build machines,
//! so this is what is verified of them here.)

use std::collections::HashMap;
use std::path::Path;

use eventbus_server::config::{Mode, Overrides, Settings};
use yaml_rust2::{Yaml, YamlLoader};

fn repo(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn yaml(path: &str) -> Yaml {
    let mut docs = YamlLoader::load_from_str(&repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(docs.len(), 1, "{path}: one document");
    docs.remove(0)
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str().unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

/// Where docker-compose.yml finds what deploy/make-dev-certs.sh writes (gitignored).
const DEV_SECRETS: &str = "./deploy/dev-secrets";

/// Whether `SECTION__KEY...` (an `EVENTBUS__` variable's rest) names a key of the shipped
/// config/default.yaml.
fn shipped_key(path: &str) -> bool {
    let defaults = yaml("config/default.yaml");
    let mut node = &defaults;
    for part in path.split("__") {
        node = &node[part.to_ascii_lowercase().as_str()];
    }
    !node.is_badvalue()
}

/// A compose service's environment, every `EVENTBUS__` variable in it checked to name a
/// shipped key.
fn service_env(name: &str, svc: &Yaml) -> HashMap<String, String> {
    let env: HashMap<String, String> = svc["environment"]
        .as_hash()
        .unwrap()
        .iter()
        .map(|(k, v)| (str_of(k, "key").to_owned(), str_of(v, "value").to_owned()))
        .collect();
    for key in env.keys().filter_map(|k| k.strip_prefix("EVENTBUS__")) {
        assert!(shipped_key(key), "{name}: EVENTBUS__{key} is no key of config/default.yaml");
    }
    env
}

/// A compose service publishes the daemon's default gRPC and HTTP ports.
fn assert_default_ports(name: &str, svc: &Yaml, defaults: &Settings) {
    let container_ports: Vec<String> = svc["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| str_of(p, "port").rsplit(':').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        container_ports,
        [defaults.server.grpc_addr.port().to_string(), defaults.server.http_addr.port().to_string()],
        "{name}"
    );
}

/// Loads a configuration the way eventbusd does, from a file and an environment.
fn load(file_text: Option<&str>, env: HashMap<String, String>) -> Settings {
    let dir = tempfile::tempdir().unwrap();
    let config_file = file_text.map(|text| {
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, text).unwrap();
        path
    });
    Settings::load(&Overrides { config_file, ..Default::default() }, &env).expect("the daemon accepts it")
}

#[test]
fn kubernetes_manifests_agree_with_the_configuration() {
    let configmap = yaml("deploy/k8s/configmap.yaml");
    let deployment = yaml("deploy/k8s/deployment.yaml");
    let service = yaml("deploy/k8s/service.yaml");

    assert_eq!(str_of(&configmap["kind"], "kind"), "ConfigMap");
    let settings = load(Some(str_of(&configmap["data"]["config.yaml"], "config.yaml")), HashMap::new());
    assert_eq!(settings.eventbus.mode, Mode::Redis);
    let (grpc_port, http_port) = (settings.server.grpc_addr.port() as i64, settings.server.http_addr.port() as i64);

    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(2));
    let pod = &deployment["spec"]["template"]["spec"];
    let grace_ms = pod["terminationGracePeriodSeconds"].as_i64().unwrap() * 1000;
    assert!(grace_ms > settings.server.shutdown_timeout_ms as i64, "SIGKILL must come after the drain");
    let container = &pod["containers"][0];
    let ports: HashMap<&str, i64> = container["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|p| (str_of(&p["name"], "port name"), p["containerPort"].as_i64().unwrap()))
        .collect();
    assert_eq!(ports, HashMap::from([("grpc", grpc_port), ("http", http_port)]));
    assert_eq!(str_of(&container["readinessProbe"]["httpGet"]["path"], "readiness"), "/readyz");
    assert_eq!(str_of(&container["readinessProbe"]["httpGet"]["port"], "readiness port"), "http");
    assert_eq!(str_of(&container["livenessProbe"]["httpGet"]["path"], "liveness"), "/healthz");
    // TLS on both listeners and authentication, with the probes still open and on HTTPS.
    assert!(settings.server.tls.enabled() && settings.auth.enabled && !settings.auth.protect_metrics);
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(str_of(&container[probe]["httpGet"]["scheme"], "scheme"), "HTTPS", "{probe}");
    }
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(str_of(&annotations["prometheus.io/scheme"], "prometheus.io/scheme"), "https");
    // Each file the configuration names is a key of a Secret mounted where it points.
    let secret_volumes: HashMap<&str, &str> = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .filter(|v| !v["secret"].is_badvalue())
        .map(|v| (str_of(&v["name"], "volume name"), str_of(&v["secret"]["secretName"], "secretName")))
        .collect();
    let secret_of = |file: &str| -> (String, String) {
        let (dir, key) = file.rsplit_once('/').unwrap();
        let mount = container["volumeMounts"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|m| str_of(&m["mountPath"], "mountPath") == dir)
            .unwrap_or_else(|| panic!("nothing is mounted at {dir} for {file}"));
        let secret = secret_volumes
            .get(str_of(&mount["name"], "mount name"))
            .unwrap_or_else(|| panic!("{dir} is not a Secret volume"));
        ((*secret).to_owned(), key.to_owned())
    };
    assert_eq!(secret_of(&settings.server.tls.cert_file), ("eventbus-tls".into(), "tls.crt".into()));
    assert_eq!(secret_of(&settings.server.tls.key_file), ("eventbus-tls".into(), "tls.key".into()));
    assert_eq!(secret_of(&settings.auth.principals_file), ("eventbus-auth".into(), "principals.yaml".into()));
    // The guide's `kubectl create secret` commands make exactly those keys.
    let readme = repo("docs/deployment.md");
    for needle in [
        "kubectl create secret generic eventbus-tls",
        "--from-file=tls.crt=",
        "--from-file=tls.key=",
        "kubectl create secret generic eventbus-auth",
        "--from-file=principals.yaml=",
    ] {
        assert!(readme.contains(needle), "docs/deployment.md lacks {needle}");
    }
    assert!(container["resources"]["requests"]["cpu"].as_str().is_some());
    assert!(container["resources"]["requests"]["memory"].as_str().is_some());

    // The config file lands where EVENTBUS_CONFIG points.
    let env = &container["env"][0];
    assert_eq!(str_of(&env["name"], "env name"), "EVENTBUS_CONFIG");
    let mount = str_of(&container["volumeMounts"][0]["mountPath"], "mountPath");
    assert_eq!(str_of(&env["value"], "env value"), format!("{mount}/config.yaml"));
    assert_eq!(pod["volumes"][0]["configMap"]["name"], configmap["metadata"]["name"]);

    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(service["spec"]["selector"], *labels);
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], *labels);
    for port in service["spec"]["ports"].as_vec().unwrap() {
        let target = str_of(&port["targetPort"], "targetPort");
        assert_eq!(port["port"].as_i64(), ports.get(target).copied(), "service port {target}");
    }
}

#[test]
fn compose_runs_two_redis_instances_the_daemon_accepts() {
    let compose = yaml("docker-compose.yml");
    let services = &compose["services"];
    let script = repo("deploy/make-dev-certs.sh");
    assert!(!services["redis"].is_badvalue());
    let defaults = Settings::default();
    for name in ["eventbusd-1", "eventbusd-2"] {
        let svc = &services[name];
        let settings = load(None, service_env(name, svc));
        assert_eq!(settings.eventbus.mode, Mode::Redis, "{name}");
        // TLS and authentication, from the files deploy/make-dev-certs.sh writes into the
        // directory mounted read-only; the healthcheck checks HTTPS against the dev CA.
        assert!(settings.server.tls.enabled() && settings.auth.enabled && !settings.auth.protect_metrics, "{name}");
        let volume = str_of(&svc["volumes"][0], "volume");
        let (host_dir, rest) = volume.split_once(':').unwrap();
        assert_eq!(host_dir, DEV_SECRETS, "{name}");
        let mount = rest.strip_suffix(":ro").unwrap_or_else(|| panic!("{name}: {volume} is not read-only"));
        for (file, written) in [
            (&settings.server.tls.cert_file, "server.crt"),
            (&settings.server.tls.key_file, "server.key"),
            (&settings.auth.principals_file, "principals.yaml"),
        ] {
            assert_eq!(*file, format!("{mount}/{written}"), "{name}");
            assert!(script.contains(&format!("$out/{written}")), "make-dev-certs.sh does not write {written}");
        }
        let healthcheck: Vec<&str> =
            svc["healthcheck"]["test"].as_vec().unwrap().iter().map(|t| str_of(t, "test")).collect();
        assert!(healthcheck.contains(&format!("{mount}/ca.crt").as_str()), "{name}: {healthcheck:?}");
        let http_port = defaults.server.http_addr.port();
        assert!(healthcheck.contains(&format!("https://localhost:{http_port}/healthz").as_str()), "{name}");
        assert_eq!(settings.eventbus.redis.host, "redis", "{name} points at the redis service");
        assert_default_ports(name, svc, &defaults);
    }
    let mount = str_of(&services["prometheus"]["volumes"][0], "volume");
    assert!(mount.starts_with("./deploy/prometheus.yml:"), "{mount}");
    let prometheus = yaml("deploy/prometheus.yml");
    // Prometheus scrapes over HTTPS, trusting the dev CA mounted where it looks.
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(str_of(&job["scheme"], "scheme"), "https");
    let ca = format!("{DEV_SECRETS}/ca.crt:{}:ro", str_of(&job["tls_config"]["ca_file"], "ca_file"));
    assert!(services["prometheus"]["volumes"].as_vec().unwrap().iter().any(|v| v.as_str() == Some(&ca)), "{ca}");
    for target in prometheus["scrape_configs"][0]["static_configs"][0]["targets"].as_vec().unwrap() {
        let (host, port) = str_of(target, "target").split_once(':').unwrap();
        assert!(!services[host].is_badvalue(), "scrape target {host} is a compose service");
        assert_eq!(port, defaults.server.http_addr.port().to_string());
    }
}

#[test]
fn dev_secrets_stay_out_of_git_and_images() {
    let dir = DEV_SECRETS.trim_start_matches("./");
    assert!(repo(".gitignore").lines().any(|l| l.trim_matches('/') == dir), ".gitignore lacks {dir}");
    assert!(repo(".dockerignore").lines().any(|l| l.trim_matches('/') == dir), ".dockerignore lacks {dir}");
    let script = repo("deploy/make-dev-certs.sh");
    assert!(script.contains("FOR DEVELOPMENT ONLY"));
    assert!(script.contains("dev-secrets") && script.contains("auth new-token"));
}

#[test]
fn dockerfile_exposes_the_ports_and_runs_unprivileged() {
    let dockerfile = repo("deploy/Dockerfile");
    let defaults = Settings::default();
    let (grpc, http) = (defaults.server.grpc_addr.port(), defaults.server.http_addr.port());
    let line = |prefix: &str| {
        dockerfile.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} line")).to_owned()
    };
    assert_eq!(line("EXPOSE"), format!("EXPOSE {grpc} {http}"));
    let user = line("USER");
    assert!(!user.ends_with(" root") && !user.ends_with(" 0"), "{user}");
    assert!(dockerfile.contains(&format!("http://127.0.0.1:{http}/healthz")), "HEALTHCHECK probes /healthz");
    assert!(line("COPY --from=build").contains("eventbusd") && line("COPY --from=build").contains("eventbus "));
    // The image's config is the shipped defaults, at the path EVENTBUS_CONFIG names.
    assert!(dockerfile.contains("COPY config/default.yaml /etc/eventbus/config.yaml"));
    assert!(dockerfile.contains("ENV EVENTBUS_CONFIG=/etc/eventbus/config.yaml"));
}

#[test]
fn compose_cluster_runs_two_instances_on_a_six_node_redis_cluster() {
    let compose = yaml("docker-compose.cluster.yml");
    let services = &compose["services"];
    let mut nodes = Vec::new();
    for i in 1..=6 {
        let node = &services[format!("redis-{i}").as_str()];
        let command: Vec<&str> = node["command"].as_vec().unwrap().iter().map(|c| str_of(c, "arg")).collect();
        assert!(command.windows(2).any(|w| w == ["--cluster-enabled", "yes"]), "redis-{i}: {command:?}");
        assert!(command.windows(2).any(|w| w == ["--appendonly", "yes"]), "redis-{i} persists");
        let ip = str_of(&node["networks"]["cluster"]["ipv4_address"], "ipv4_address");
        nodes.push(format!("{ip}:6379"));
    }
    let init = str_of(&services["redis-cluster-init"]["command"][2], "init script");
    assert!(init.contains(&format!("--cluster create {} --cluster-replicas 1", nodes.join(" "))), "{init}");
    let defaults = Settings::default();
    for name in ["eventbusd-1", "eventbusd-2"] {
        let svc = &services[name];
        let settings = load(None, service_env(name, svc));
        assert_eq!(settings.eventbus.mode, Mode::Redis, "{name}");
        assert_eq!(settings.eventbus.redis.cluster_nodes, nodes, "{name}: every node as a seed");
        assert_default_ports(name, svc, &defaults);
        let init_done = str_of(&svc["depends_on"]["redis-cluster-init"]["condition"], "condition");
        assert_eq!(init_done, "service_completed_successfully", "{name} starts once the cluster exists");
    }
}
