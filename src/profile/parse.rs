//! Reading profiles from files: a single profile, or a ConfigMap whose `data` keys are profiles.

use serde::Deserialize;

use super::format::MAX_PROFILE_BYTES;
use super::{Problem, Profile};

/// A profile read from a file, or why it could not be read.
#[derive(Debug, Clone)]
pub struct NamedProfile {
    /// ConfigMap key, or the file's stem for a plain profile file.
    pub name: String,
    pub profile: Result<Profile, Problem>,
}

/// Parse one profile's YAML text. Text over [`MAX_PROFILE_BYTES`] is refused unread.
pub fn parse_profile(name: &str, text: &str) -> Result<Profile, Problem> {
    check_size(name, "profile", text.len())?;
    serde_yaml::from_str::<Profile>(text).map_err(|e| {
        let why = if e
            .to_string()
            .contains("timeSlicing: unknown field `consumable`")
        {
            format!("; {}", super::format::TIME_SLICING_NOT_CONSUMABLE)
        } else {
            String::new()
        };
        Problem::error(name, format!("cannot read the profile: {e}{why}"))
    })
}

/// Refuse `len` bytes of `what` over [`MAX_PROFILE_BYTES`], before any parsing.
pub fn check_size(name: &str, what: &str, len: usize) -> Result<(), Problem> {
    if len <= MAX_PROFILE_BYTES {
        return Ok(());
    }
    Err(Problem::error(
        name,
        format!(
            "the {what} is larger than {MAX_PROFILE_BYTES} bytes (1 MiB), the most gpu-share reads: a ConfigMap cannot hold more (Kubernetes refuses ConfigMaps over 1 MiB)"
        ),
    ))
}

/// What decides how a YAML document is read: `kind: ConfigMap` or a profile. Other fields, and
/// documents that are not mappings, are skipped unread, so a value `serde_yaml::Value` cannot
/// hold (an integer over 64 bits) is left for the profile parse, which names its field.
#[derive(Default)]
struct Document {
    kind: Option<serde_yaml::Value>,
    metadata: Option<serde_yaml::Value>,
    data: Option<serde_yaml::Value>,
}

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

impl<'de> serde::de::Visitor<'de> for DocumentVisitor {
    type Value = Document;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML document")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        let mut doc = Document::default();
        while let Some(key) = map.next_key::<serde_yaml::Value>()? {
            let slot = match key.as_str() {
                Some("kind") => &mut doc.kind,
                Some("metadata") => &mut doc.metadata,
                Some("data") => &mut doc.data,
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value()?);
        }
        Ok(doc)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Document, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Document::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_i128<E>(self, _: i128) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_u128<E>(self, _: u128) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_unit<E>(self) -> Result<Document, E> {
        Ok(Document::default())
    }

    fn visit_none<E>(self) -> Result<Document, E> {
        Ok(Document::default())
    }
}

/// The parts of a ConfigMap we read.
#[derive(Deserialize)]
struct ConfigMap {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    data: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct Metadata {
    #[serde(default)]
    name: Option<String>,
}

/// Read every profile in a file: the file is either one profile (named `stem`) or one or more
/// YAML documents of which the `kind: ConfigMap` ones hold profiles under `data`. A file over
/// [`MAX_PROFILE_BYTES`] is refused unread.
pub fn read_profiles(stem: &str, text: &str) -> Vec<NamedProfile> {
    if let Err(problem) = check_size(stem, "file", text.len()) {
        return vec![NamedProfile {
            name: stem.to_string(),
            profile: Err(problem),
        }];
    }
    let mut out = Vec::new();
    let mut saw_config_map = false;
    for doc in serde_yaml::Deserializer::from_str(text) {
        let document = match Document::deserialize(doc) {
            Ok(d) => d,
            Err(e) => {
                out.push(NamedProfile {
                    name: stem.to_string(),
                    profile: Err(Problem::error(stem, format!("not valid YAML: {e}"))),
                });
                return out;
            }
        };
        if document.kind.as_ref().and_then(|k| k.as_str()) == Some("ConfigMap") {
            saw_config_map = true;
            out.extend(profiles_in_config_map(stem, document));
        }
    }
    if !saw_config_map {
        out.push(NamedProfile {
            name: stem.to_string(),
            profile: parse_profile(stem, text),
        });
    }
    out
}

fn profiles_in_config_map(stem: &str, document: Document) -> Vec<NamedProfile> {
    let mut value = serde_yaml::Mapping::new();
    if let Some(metadata) = document.metadata {
        value.insert("metadata".into(), metadata);
    }
    if let Some(data) = document.data {
        value.insert("data".into(), data);
    }
    let cm: ConfigMap = match serde_yaml::from_value(serde_yaml::Value::Mapping(value)) {
        Ok(cm) => cm,
        Err(e) => {
            return vec![NamedProfile {
                name: stem.to_string(),
                profile: Err(Problem::error(
                    stem,
                    format!("cannot read the ConfigMap: {e}"),
                )),
            }]
        }
    };
    let cm_name = cm.metadata.name.unwrap_or_else(|| stem.to_string());
    if cm.data.is_empty() {
        return vec![NamedProfile {
            name: cm_name.clone(),
            profile: Err(Problem::error(
                &cm_name,
                "the ConfigMap has no `data`: each key of `data` is one profile",
            )),
        }];
    }
    cm.data
        .into_iter()
        .map(|(key, text)| {
            let profile = check_key(&key).and_then(|()| parse_profile(&key, &text));
            NamedProfile { name: key, profile }
        })
        .collect()
}

/// A key is used as the value of the node label `gpu-share.dev/profile`, so it must be a valid
/// label value: at most 63 characters, alphanumerics and `-_.`, alphanumeric at both ends.
pub fn check_key(key: &str) -> Result<(), Problem> {
    let ok_chars = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ok_ends = key.starts_with(|c: char| c.is_ascii_alphanumeric())
        && key.ends_with(|c: char| c.is_ascii_alphanumeric());
    if key.len() <= 63 && ok_chars && ok_ends {
        Ok(())
    } else {
        Err(Problem::error(
            key,
            "this ConfigMap key cannot be a node label value (gpu-share.dev/profile=<key>): \
             use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_maps_yield_one_profile_per_key() {
        let text = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: gpu-share-profiles}
data:
  small: |
    version: v1
    rules: [{devices: all, timeSlicing: {replicas: 4}}]
  bad: |
    version: v1
    rules: [{devices: all, timeSlicing: {replica: 4}}]
"#;
        let got = read_profiles("cm", text);
        assert_eq!(got.len(), 2);
        let bad = got.iter().find(|p| p.name == "bad").unwrap();
        let err = bad.profile.as_ref().unwrap_err();
        assert!(err.message.contains("unknown field `replica`"), "{err}");
        assert!(got
            .iter()
            .find(|p| p.name == "small")
            .unwrap()
            .profile
            .is_ok());
    }

    #[test]
    fn keys_must_be_label_values() {
        assert!(check_key("inference-small").is_ok());
        assert!(check_key("-bad").is_err());
        assert!(check_key("has space").is_err());
        assert!(check_key(&"x".repeat(64)).is_err());
    }
}
