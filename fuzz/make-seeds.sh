#!/bin/sh
# (Re)create the seed corpora from the example profiles: each profile alone for both targets,
# and for configmap_reader one ConfigMap holding all of them (as `kubectl create configmap
# --from-file` writes it) plus a two-document file. Run from anywhere.
set -eu
cd "$(dirname "$0")"
rm -rf seeds
mkdir -p seeds/profile_parser seeds/configmap_reader
cm=seeds/configmap_reader/all-profiles-configmap.yaml
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-share-profiles\n  namespace: gpu-share\ndata:\n' > "$cm"
for f in ../profiles/*.yaml; do
  name=$(basename "$f" .yaml)
  cp "$f" "seeds/profile_parser/$name.yaml"
  cp "$f" "seeds/configmap_reader/$name.yaml"
  printf '  %s: |\n' "$name" >> "$cm"
  sed 's/^/    /' "$f" >> "$cm"
done
{ cat "$cm"; printf -- '---\n'; sed 's/gpu-share-profiles/second/' "$cm"; } > seeds/configmap_reader/two-documents.yaml
