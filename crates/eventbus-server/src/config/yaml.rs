//! YAML files as a layer of settings, read with `serde_norway` (the parser the
//! principals file uses too), so the daemon carries one YAML parser, not two.

use std::error::Error;

use config::{FileStoredFormat, Format, Map, Value, ValueKind};
use serde_norway::Value as Yaml;

/// The YAML format of the settings files.
#[derive(Debug, Clone, Copy)]
pub(super) struct YamlFile;

type ParseResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

impl Format for YamlFile {
    fn parse(&self, uri: Option<&String>, text: &str) -> ParseResult<Map<String, Value>> {
        match serde_norway::from_str::<Yaml>(text)? {
            // An empty file, or one of comments only, sets nothing.
            Yaml::Null => Ok(Map::new()),
            Yaml::Mapping(mapping) => table(uri, mapping),
            other => Err(format!("the settings must be a mapping of keys, not {}", kind(&other)).into()),
        }
    }
}

impl FileStoredFormat for YamlFile {
    fn file_extensions(&self) -> &'static [&'static str] {
        &["yaml", "yml"]
    }
}

fn table(uri: Option<&String>, mapping: serde_norway::Mapping) -> ParseResult<Map<String, Value>> {
    let mut table = Map::new();
    for (key, value) in mapping {
        let key = match key {
            Yaml::String(key) => key,
            Yaml::Number(key) => key.to_string(),
            Yaml::Bool(key) => key.to_string(),
            other => return Err(format!("a key must be a string, not {}", kind(&other)).into()),
        };
        table.insert(key, value_of(uri, value)?);
    }
    Ok(table)
}

fn value_of(uri: Option<&String>, yaml: Yaml) -> ParseResult<Value> {
    let kind = match yaml {
        Yaml::Null => ValueKind::Nil,
        Yaml::Bool(b) => ValueKind::Boolean(b),
        Yaml::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => ValueKind::I64(i),
            (None, Some(u), _) => ValueKind::U64(u),
            (None, None, Some(f)) => ValueKind::Float(f),
            (None, None, None) => return Err(format!("cannot read the number {n}").into()),
        },
        Yaml::String(s) => ValueKind::String(s),
        Yaml::Sequence(items) => {
            ValueKind::Array(items.into_iter().map(|item| value_of(uri, item)).collect::<ParseResult<_>>()?)
        }
        Yaml::Mapping(mapping) => ValueKind::Table(table(uri, mapping)?),
        Yaml::Tagged(tagged) => return value_of(uri, tagged.value),
    };
    Ok(Value::new(uri, kind))
}

fn kind(yaml: &Yaml) -> &'static str {
    match yaml {
        Yaml::Null => "null",
        Yaml::Bool(_) => "a boolean",
        Yaml::Number(_) => "a number",
        Yaml::String(_) => "a string",
        Yaml::Sequence(_) => "a list",
        Yaml::Mapping(_) => "a mapping",
        Yaml::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ParseResult<Map<String, Value>> {
        YamlFile.parse(None, text)
    }

    #[test]
    fn files_read_as_tables_of_typed_values() {
        assert!(parse("").unwrap().is_empty() && parse("# nothing set\n").unwrap().is_empty());
        let table =
            parse("server:\n  grpc_addr: '127.0.0.1:1'\n  ratio: 0.5\n  big: 18446744073709551615\nlist: [a, 2]\n")
                .unwrap();
        let ValueKind::Table(server) = &table["server"].kind else { panic!("{table:?}") };
        assert!(matches!(&server["grpc_addr"].kind, ValueKind::String(s) if s == "127.0.0.1:1"));
        assert!(matches!(server["ratio"].kind, ValueKind::Float(f) if f == 0.5));
        assert!(matches!(server["big"].kind, ValueKind::U64(u64::MAX)));
        assert!(matches!(&table["list"].kind, ValueKind::Array(items) if items.len() == 2));
    }

    #[test]
    fn what_is_not_a_mapping_of_settings_is_refused() {
        assert!(parse("- a\n- b\n").unwrap_err().to_string().contains("must be a mapping"));
        assert!(parse("a: 1\na: 2\n").unwrap_err().to_string().contains("duplicate"), "a key set twice");
        assert!(parse("a: [1\n").is_err());
    }
}
