//! Reading profiles from files: a single profile, or a ConfigMap whose `data` keys are profiles.

use serde::Deserialize;

use super::{Problem, Profile};

/// A profile read from a file, or why it could not be read.
#[derive(Debug, Clone)]
pub struct NamedProfile {
    /// ConfigMap key, or the file's stem for a plain profile file.
    pub name: String,
    pub profile: Result<Profile, Problem>,
}

/// Parse one profile's YAML text.
pub fn parse_profile(name: &str, text: &str) -> Result<Profile, Problem> {
    serde_yaml::from_str::<Profile>(text)
        .map_err(|e| Problem::error(name, format!("cannot read the profile: {e}")))
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
/// YAML documents of which the `kind: ConfigMap` ones hold profiles under `data`.
pub fn read_profiles(stem: &str, text: &str) -> Vec<NamedProfile> {
    let mut out = Vec::new();
    let mut saw_config_map = false;
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                out.push(NamedProfile {
                    name: stem.to_string(),
                    profile: Err(Problem::error(stem, format!("not valid YAML: {e}"))),
                });
                return out;
            }
        };
        if value.get("kind").and_then(|k| k.as_str()) == Some("ConfigMap") {
            saw_config_map = true;
            out.extend(profiles_in_config_map(stem, value));
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

fn profiles_in_config_map(stem: &str, value: serde_yaml::Value) -> Vec<NamedProfile> {
    let cm: ConfigMap = match serde_yaml::from_value(value) {
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
