//! The three patch formats the apiserver accepts besides server-side apply:
//! JSON merge patch (RFC 7386), strategic merge patch (for the list fields the agent's resources
//! carry) and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// How a list field merges under a strategic merge patch (the `patchStrategy` /
/// `patchMergeKey` tags of the Go types).
enum ListStrategy {
    /// Lists of objects merged by this key.
    MergeKey(&'static str),
    /// Lists of scalars merged as a set (`metadata.finalizers`).
    MergePrimitive,
}

/// The list fields with a merge strategy in the resources the double serves, by dotted path
/// from the object root (array levels are skipped). Every other list is replaced whole, as
/// `spec.taints` and `spec.tolerations` are.
fn list_strategy(path: &str) -> Option<ListStrategy> {
    use ListStrategy::*;
    let container_lists = [
        "spec.containers",
        "spec.initContainers",
        "spec.ephemeralContainers",
    ];
    for c in container_lists {
        if path == c {
            return Some(MergeKey("name"));
        }
        if let Some(sub) = path.strip_prefix(c).and_then(|s| s.strip_prefix('.')) {
            return match sub {
                "env" => Some(MergeKey("name")),
                "ports" => Some(MergeKey("containerPort")),
                "volumeMounts" => Some(MergeKey("mountPath")),
                "volumeDevices" => Some(MergeKey("devicePath")),
                _ => None,
            };
        }
    }
    match path {
        "metadata.finalizers" => Some(MergePrimitive),
        "metadata.ownerReferences" => Some(MergeKey("uid")),
        "status.conditions" => Some(MergeKey("type")),
        "status.addresses" => Some(MergeKey("type")),
        "status.podIPs" | "status.hostIPs" => Some(MergeKey("ip")),
        "status.volumesAttached" => Some(MergeKey("name")),
        "spec.volumes" | "spec.imagePullSecrets" => Some(MergeKey("name")),
        _ => None,
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Applies a strategic merge patch: maps merge like a merge patch, `$patch: replace|delete`
/// directives, `$retainKeys`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>`
/// (accepted, order not enforced) and keyed list merges per [`list_strategy`].
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    smp_map(target, patch, "")
}

fn smp_map(target: &mut Value, patch: &Value, path: &str) -> Result<(), String> {
    let Value::Object(p) = patch else {
        return Err(format!("patch at {path:?} is not an object"));
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut m = p.clone();
            m.remove("$patch");
            *target = Value::Object(m);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type {other:?}")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let retain: Option<Vec<String>> = p.get("$retainKeys").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    });
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(Value::Array(list)) = t.get_mut(field) {
                list.retain(|e| !remove.contains(&e));
            }
            continue;
        }
        let child_path = join(path, k);
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                smp_map(slot, v, &child_path)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            Value::Array(items) => {
                let merged = match (list_strategy(&child_path), t.get(k)) {
                    (Some(strategy), Some(Value::Array(existing))) => {
                        smp_list(existing.clone(), items, &strategy, &child_path)?
                    }
                    (Some(strategy), _) => smp_list(Vec::new(), items, &strategy, &child_path)?,
                    (None, _) => Value::Array(items.clone()),
                };
                t.insert(k.clone(), merged);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(keep) = retain {
        t.retain(|k, _| keep.contains(k));
    }
    Ok(())
}

fn smp_list(
    mut existing: Vec<Value>,
    patch: &[Value],
    strategy: &ListStrategy,
    path: &str,
) -> Result<Value, String> {
    match strategy {
        ListStrategy::MergePrimitive => {
            for v in patch {
                if !existing.contains(v) {
                    existing.push(v.clone());
                }
            }
            Ok(Value::Array(existing))
        }
        ListStrategy::MergeKey(key) => {
            if patch
                .iter()
                .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
            {
                let kept = patch
                    .iter()
                    .filter(|e| e.get("$patch").is_none())
                    .cloned()
                    .collect();
                return Ok(Value::Array(kept));
            }
            for item in patch {
                let Some(k) = item.get(*key) else {
                    return Err(format!("map in {path} is missing its merge key {key:?}"));
                };
                let pos = existing.iter().position(|e| e.get(*key) == Some(k));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        existing.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => smp_map(&mut existing[i], item, path)?,
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        smp_map(&mut fresh, item, path)?;
                        existing.push(fresh);
                    }
                }
            }
            Ok(Value::Array(existing))
        }
    }
}

/// RFC 6902 JSON patch. Errors name the failing operation.
pub(crate) fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for (i, op) in ops.iter().enumerate() {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or(format!("operation {i} has no \"op\""))?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or(format!("operation {i} has no \"path\""))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or(format!("operation {i} ({name}) has no \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or(format!("operation {i} ({name}) has no \"from\""))
        };
        match name {
            "add" => add(target, path, value()?)?,
            "remove" => {
                remove(target, path)?;
            }
            "replace" => {
                remove(target, path)?;
                add(target, path, value()?)?;
            }
            "move" => {
                let v = remove(target, from()?)?;
                add(target, path, v)?;
            }
            "copy" => {
                let v = target
                    .pointer(from()?)
                    .cloned()
                    .ok_or(format!("copy from missing path {}", from()?))?;
                add(target, path, v)?;
            }
            "test" => {
                if target.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

fn split_pointer(path: &str) -> Result<(String, String), String> {
    if path.is_empty() {
        return Err("the root cannot be patched".into());
    }
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or(format!("invalid JSON pointer {path:?}"))?;
    Ok((
        parent.to_string(),
        last.replace("~1", "/").replace("~0", "~"),
    ))
}

fn add(target: &mut Value, path: &str, v: Value) -> Result<(), String> {
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(&parent) {
        Some(Value::Object(m)) => {
            m.insert(last, v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let idx = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .map_err(|_| format!("invalid array index in {path}"))?
            };
            if idx > a.len() {
                return Err(format!("array index out of bounds in {path}"));
            }
            a.insert(idx, v);
            Ok(())
        }
        _ => Err(format!(
            "add operation does not apply: doc is missing path: {path:?}"
        )),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("remove operation does not apply: doc is missing path: {path:?}");
    match target.pointer_mut(&parent) {
        Some(Value::Object(m)) => m.remove(&last).ok_or_else(missing),
        Some(Value::Array(a)) => {
            let idx = last.parse::<usize>().map_err(|_| missing())?;
            if idx < a.len() {
                Ok(a.remove(idx))
            } else {
                Err(missing())
            }
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        merge_patch(
            &mut t,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        );
        assert_eq!(t, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn strategic_merges_conditions_by_type_and_replaces_taints() {
        let mut t = json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]},
            "metadata": {"finalizers": ["f1"]}
        });
        strategic_merge_patch(
            &mut t,
            &json!({
                "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "$patch": "delete"}]},
                "metadata": {"finalizers": ["f2"], "$deleteFromPrimitiveList/finalizers": ["f1"]}
            }),
        )
        .unwrap();
        assert_eq!(
            t["spec"]["taints"],
            json!([{"key": "b", "effect": "NoExecute"}])
        );
        assert_eq!(
            t["status"]["conditions"],
            json!([{"type": "Ready", "status": "False"}])
        );
        assert_eq!(t["metadata"]["finalizers"], json!(["f2"]));
    }

    #[test]
    fn json_patch_ops() {
        let mut t = json!({"metadata": {"labels": {"a/b": "1"}}, "l": [1, 2]});
        json_patch(
            &mut t,
            &json!([
                {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
                {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "remove", "path": "/l/0"}
            ]),
        )
        .unwrap();
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"a/b": "2"}}, "l": [2, 3]})
        );
        assert!(json_patch(&mut t, &json!([{"op": "test", "path": "/l/0", "value": 9}])).is_err());
    }
}
