//! Loading: the layers, the Java-style aliases and layout, command-line overrides.

use super::*;

/// Java-style variable names and the keys they stand for.
const ALIASES: &[(&str, &str)] = &[
    ("EVENTBUS_ENABLED", "eventbus.enabled"),
    ("EVENTBUS_MODE", "eventbus.mode"),
    ("EVENTBUS_QUEUE_CAPACITY", "eventbus.default_queue_capacity"),
    ("EVENTBUS_OFFER_TIMEOUT", "eventbus.offer_timeout_ms"),
    ("REDIS_HOST", "eventbus.redis.host"),
    ("REDIS_PORT", "eventbus.redis.port"),
    ("REDIS_PASSWORD", "eventbus.redis.password"),
    ("REDIS_DATABASE", "eventbus.redis.database"),
    ("EVENTBUS_REDIS_PREFIX", "eventbus.redis.prefix"),
    ("EVENTBUS_REDIS_POOL_MAX", "eventbus.redis.pool.max_total"),
    ("EVENTBUS_REDIS_POOL_MAX_IDLE", "eventbus.redis.pool.max_idle"),
    ("EVENTBUS_REDIS_POOL_MIN_IDLE", "eventbus.redis.pool.min_idle"),
    ("EVENTBUS_METRICS_ENABLED", "eventbus.metrics.enabled"),
    ("REDIS_CLUSTER_NODES", "eventbus.redis.cluster_nodes"),
];

/// The list-valued keys: set from the environment, each takes a comma-separated value
/// (`EVENTBUS__SERVER__HTTP__ALLOWED_ORIGINS=https://a.example,https://b.example`); an
/// empty value is the empty list.
pub(super) const LIST_KEYS: &[&str] = &[
    "server.http.allowed_origins",
    "server.http.allowed_hosts",
    "eventbus.redis.cluster_nodes",
    "auth.default_permissions.publish.allow",
    "auth.default_permissions.publish.deny",
    "auth.default_permissions.subscribe.allow",
    "auth.default_permissions.subscribe.deny",
    "auth.default_permissions.consumers.allow",
    "auth.default_permissions.manage_consumers",
    "push.deny_networks",
    "push.allow_networks",
];

/// The keys of the Java-style `eventbus.common` section; each is a spelling of the flat
/// `eventbus.<key>`.
const COMMON_KEYS: &[&str] =
    &["default_queue_capacity", "max_queue_capacity", "offer_timeout_ms", "overflow", "max_batch", "max_payload_bytes"];

/// Command-line values, the top layer. `None` leaves the lower layers alone.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub config_file: Option<PathBuf>,
    pub grpc_addr: Option<String>,
    pub http_addr: Option<String>,
    pub mode: Option<String>,
    pub log_level: Option<String>,
    pub log_format: Option<String>,
    /// `durable.data_dir`: the embedded store's directory.
    pub data_dir: Option<String>,
}

impl Settings {
    /// Loads every layer. `env` is the process environment (a map, for tests).
    pub fn load(overrides: &Overrides, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut layers = Layers::default();
        layers.add(&File::from_str(DEFAULT_YAML, YamlFile), "the built-in defaults")?;
        match &overrides.config_file {
            Some(path) if !path.exists() => return Err(ConfigError::MissingFile { path: path.clone() }),
            Some(path) => {
                layers.add(&File::new(&path.to_string_lossy(), YamlFile), &path.display().to_string())?;
            }
            None if Path::new(IMPLICIT_FILE).exists() => {
                layers.add(&File::new(IMPLICIT_FILE, YamlFile), IMPLICIT_FILE)?;
            }
            None => {}
        }
        let aliases: Map<String, Value> = ALIASES
            .iter()
            .filter_map(|(var, key)| {
                env.get(*var).map(|v| (key.to_string(), Value::new(Some(&var.to_string()), v.clone())))
            })
            .collect();
        layers.add(&Layer(typed_like_env(aliases)), "the Java-style environment variables")?;
        let environment = LIST_KEYS.iter().fold(
            Environment::with_prefix("EVENTBUS")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .source(Some(env.clone().into_iter().collect())),
            |environment, key| environment.with_list_parse_key(key),
        );
        layers.add(&Layer(comma_lists(environment.collect()?)), "the EVENTBUS__ environment variables")?;
        let mut builder = layers.builder;
        let flags = [
            ("server.grpc_addr", &overrides.grpc_addr),
            ("server.http_addr", &overrides.http_addr),
            ("eventbus.mode", &overrides.mode),
            ("log.level", &overrides.log_level),
            ("log.format", &overrides.log_format),
            ("durable.data_dir", &overrides.data_dir),
        ];
        for (key, value) in flags {
            if let Some(value) = value {
                builder = builder.set_override(key, value.as_str())?;
            }
        }
        let spellings = layers.seed_spelled;
        let settings = builder
            .build()
            .and_then(Config::try_deserialize::<Settings>)
            .map_err(ConfigError::from)
            .and_then(|settings| settings.validate().map(|()| settings));
        settings.map_err(|err| match err.key().and_then(|key| spellings.get(key)) {
            Some((nested, origin)) => {
                ConfigError::SeedSpelling { nested: nested.clone(), origin: origin.clone(), source: Box::new(err) }
            }
            None => name_the_variable(err, env),
        })
    }
}

/// An unknown key that an `EVENTBUS__` variable spells: the error names the variable, so
/// that a typo in the environment (`EVENTBUS__SERVRE__GRPC_ADDR`) is found where it is.
fn name_the_variable(err: ConfigError, env: &HashMap<String, String>) -> ConfigError {
    let text = err.to_string();
    let Some(field) = text.split("unknown field `").nth(1).and_then(|rest| rest.split('`').next()) else {
        return err;
    };
    let mut variables: Vec<&str> = env
        .keys()
        .filter(|name| {
            name.strip_prefix("EVENTBUS__")
                .is_some_and(|key| key.split("__").any(|part| part.eq_ignore_ascii_case(field)))
        })
        .map(String::as_str)
        .collect();
    if variables.is_empty() {
        return err;
    }
    variables.sort_unstable();
    ConfigError::UnknownVariable { variables: variables.join(", "), source: Box::new(err) }
}

/// The layers merged so far, each rewritten to the flat layout.
#[derive(Debug, Default)]
struct Layers {
    builder: config::ConfigBuilder<config::builder::DefaultState>,
    /// Flat key → (Java-style key, layer) for the settings whose current value was
    /// written the Java-style way, so that an error about one can say how it was written.
    seed_spelled: HashMap<String, (String, String)>,
}

impl Layers {
    /// Adds `source` above the layers before it. `origin` names it in errors.
    fn add(&mut self, source: &dyn Source, origin: &str) -> Result<(), ConfigError> {
        let mut cache = Value::new(None, Map::<String, Value>::new());
        source.collect_to(&mut cache)?;
        let ValueKind::Table(mut tree) = cache.kind else {
            return Ok(());
        };
        let moved = flatten_seed_layout(&mut tree, origin)?;
        if let Some(ValueKind::Table(eventbus)) = tree.get("eventbus").map(|v| &v.kind) {
            for key in COMMON_KEYS.iter().filter(|key| eventbus.contains_key(**key)) {
                let flat = format!("eventbus.{key}");
                if moved.contains(key) {
                    self.seed_spelled.insert(flat, (format!("eventbus.common.{key}"), origin.to_owned()));
                } else {
                    self.seed_spelled.remove(&flat);
                }
            }
        }
        self.builder = std::mem::take(&mut self.builder).add_source(Layer(tree));
        Ok(())
    }
}

/// Rewrites one layer's Java-style keys to the flat layout: `eventbus.common.<key>`
/// becomes `eventbus.<key>`, and the Java-style empty `eventbus.in_memory` section goes.
/// Returns the keys moved.
fn flatten_seed_layout(tree: &mut Map<String, Value>, origin: &str) -> Result<Vec<&'static str>, ConfigError> {
    let Some(ValueKind::Table(eventbus)) = tree.get_mut("eventbus").map(|v| &mut v.kind) else {
        // Absent, or not a mapping: deserialization names the problem.
        return Ok(Vec::new());
    };
    let section = |key: &'static str, value: Value| match value.kind {
        ValueKind::Nil => Ok(Map::new()),
        ValueKind::Table(table) => Ok(table),
        _ => Err(ConfigError::NotASection { key, origin: origin.to_owned() }),
    };
    if let Some(in_memory) = eventbus.remove("in_memory")
        && let Some(key) = section("eventbus.in_memory", in_memory)?.keys().next()
    {
        let key = format!("eventbus.in_memory.{key}");
        return Err(ConfigError::UnknownSeedKey { key, origin: origin.to_owned(), expected: &[] });
    }
    let Some(common) = eventbus.remove("common") else {
        return Ok(Vec::new());
    };
    let mut moved = Vec::new();
    for (key, value) in section("eventbus.common", common)? {
        let Some(known) = COMMON_KEYS.iter().copied().find(|k| *k == key) else {
            let key = format!("eventbus.common.{key}");
            return Err(ConfigError::UnknownSeedKey { key, origin: origin.to_owned(), expected: COMMON_KEYS });
        };
        if eventbus.contains_key(known) {
            return Err(ConfigError::DuplicateKey {
                flat: format!("eventbus.{known}"),
                nested: format!("eventbus.common.{known}"),
                origin: origin.to_owned(),
            });
        }
        eventbus.insert(key, value);
        moved.push(known);
    }
    Ok(moved)
}

/// One layer, already collected and flattened.
#[derive(Debug, Clone)]
struct Layer(Map<String, Value>);

impl Source for Layer {
    fn clone_into_box(&self) -> Box<dyn Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self.0.clone())
    }
}

/// The Java-style environment variables, already mapped to their keys, typed the way the
/// EVENTBUS__ variables are parsed, so numbers and booleans deserialize.
fn typed_like_env(aliases: Map<String, Value>) -> Map<String, Value> {
    aliases
        .into_iter()
        .map(|(k, v)| {
            let origin = v.origin().map(str::to_owned);
            let raw = v.into_string().unwrap_or_default();
            let kind = if LIST_KEYS.contains(&k.as_str()) {
                ValueKind::Array(split_list(&raw, origin.as_ref()))
            } else if let Ok(b) = raw.to_ascii_lowercase().parse::<bool>() {
                ValueKind::Boolean(b)
            } else if let Ok(i) = raw.parse::<i64>() {
                ValueKind::I64(i)
            } else {
                ValueKind::String(raw)
            };
            (k, Value::new(origin.as_ref(), kind))
        })
        .collect()
}

/// The items of a comma-separated list value, trimmed; an empty value is no item.
fn split_list(raw: &str, origin: Option<&String>) -> Vec<Value> {
    raw.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| Value::new(origin, ValueKind::String(item.to_owned())))
        .collect()
}

/// The environment's list values as [`LIST_KEYS`] say: split on commas, trimmed, and
/// a value the environment parsed as a number or boolean (one item, `8080`) still a
/// list.
fn comma_lists(mut values: Map<String, Value>) -> Map<String, Value> {
    for key in LIST_KEYS {
        let Some(value) = values.get_mut(*key) else { continue };
        let origin = value.origin().map(str::to_owned);
        let items: Vec<String> = match &value.kind {
            ValueKind::Array(items) => items.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        };
        *value = Value::new(origin.as_ref(), ValueKind::Array(split_list(&items.join(","), origin.as_ref())));
    }
    values
}
