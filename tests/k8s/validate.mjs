// SPDX-License-Identifier: Apache-2.0
// Validate Kubernetes objects (the YAML `kubectl kustomize` renders) against the API schemas of a
// current release, strictly: an unknown field or a wrong type anywhere is an error.
//   NODE_PATH is not used by ES modules: run it from a directory whose node_modules holds
//   tests/node/package.json's packages (test_deploy_manifests.py copies it into build/npm).
//   node validate.mjs FILE.yaml...
// Two independent checks per object:
//  1. the Kubernetes OpenAPI types as @kubernetes/client-node generates them (attributeTypeMap of
//     every model): unknown fields, and the type of every value (string, integer, boolean,
//     IntOrString, arrays, maps, nested objects); built-in kinds only;
//  2. kubernetes-models' JSON-schema validators (ajv, from the same OpenAPI documents, and the
//     Prometheus Operator CRDs for PodMonitor, cert-manager's for Issuer and Certificate): required
//     fields, enums, formats, types;
//  3. for the kinds no npm package has a schema for, a JSON schema of our own in
//     tests/k8s/schemas/<group>/<version>/<Kind>.json (ajv, strict: Multus'
//     NetworkAttachmentDefinition, whose spec.config must also be a CNI configuration: the
//     "jsonContent" keyword parses a JSON string and validates it), with the object's metadata
//     checked against the Kubernetes ObjectMeta type as in 1.
// Prints one line per error and exits 1, or a summary line and exits 0.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import * as path from "node:path";

const require = createRequire(path.join(process.cwd(), "package.json"));
const YAML = require("yaml");
const modelsDir = path.join(path.dirname(require.resolve("@kubernetes/client-node/package.json")),
                            "dist", "gen", "models");
const models = await import(pathToFileURL(path.join(modelsDir, "all.js")).href);
const versions = { "kubernetes-models": require("kubernetes-models/package.json").version,
                   "@kubernetes/client-node": require("@kubernetes/client-node/package.json").version };

const errors = [];

// Our own schemas (3.), compiled on first use.
const Ajv = require("ajv");
const ajv = new Ajv({ allErrors: true, strict: false });
ajv.addKeyword({
  keyword: "jsonContent",
  type: "string",
  compile(schema) {
    const inner = ajv.compile(schema);
    const check = (data) => {
      let parsed;
      try {
        parsed = JSON.parse(data);
      } catch (e) {
        check.errors = [{ message: `is not JSON: ${e.message}` }];
        return false;
      }
      if (inner(parsed)) return true;
      check.errors = inner.errors.map((e) => ({ params: e.params, message: `(its JSON) ${e.instancePath || "/"} ${e.message}` }));
      return false;
    };
    return check;
  },
});
const schemaDir = path.join(path.dirname(new URL(import.meta.url).pathname), "schemas");
const localValidators = new Map();
function localSchema(apiVersion, kind) {
  const key = `${apiVersion} ${kind}`;
  if (!localValidators.has(key)) {
    const file = path.join(schemaDir, ...apiVersion.split("/"), kind + ".json");
    let v = null;
    try {
      v = ajv.compile(JSON.parse(readFileSync(file, "utf8")));
    } catch (e) {
      if (e.code !== "ENOENT") throw e;
    }
    localValidators.set(key, v);
  }
  return localValidators.get(key);
}

function typeName(v) {
  return Array.isArray(v) ? "array" : v === null ? "null" : typeof v;
}

// Walk value against the client-node type string t.
function walk(value, t, where) {
  if (value === null || value === undefined) return; // null means unset, as the API server reads it
  const arr = /^Array<(.+)>$/.exec(t);
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(t);
  const bad = (want) => errors.push(`${where}: wrong type: ${typeName(value)} ${JSON.stringify(value)}, want ${want}`);
  if (arr) {
    if (!Array.isArray(value)) return bad(t);
    value.forEach((v, i) => walk(v, arr[1], `${where}[${i}]`));
  } else if (map) {
    if (typeName(value) !== "object") return bad(t);
    for (const [k, v] of Object.entries(value)) walk(v, map[1], `${where}.${k}`);
  } else if (t === "string" || t === "Date") {
    if (typeof value !== "string") bad("string");
  } else if (t === "number") {
    if (typeof value !== "number") bad("number");
  } else if (t === "boolean") {
    if (typeof value !== "boolean") bad("boolean");
  } else if (t === "IntOrString") {
    if (typeof value !== "string" && !Number.isInteger(value)) bad("integer or string");
  } else if (t === "any" || t === "object") {
    // free-form
  } else {
    const model = models[t];
    if (!model || !model.attributeTypeMap) return errors.push(`${where}: no schema for type ${t}`);
    if (typeName(value) !== "object") return bad(t);
    const attrs = new Map(model.attributeTypeMap.map((a) => [a.baseName, a]));
    for (const [k, v] of Object.entries(value)) {
      const a = attrs.get(k);
      if (!a) {
        errors.push(`${where}.${k}: unknown field (${t} has no field "${k}")`);
        continue;
      }
      if (a.format === "int32" || a.format === "int64") {
        if (v !== null && !Number.isInteger(v)) {
          errors.push(`${where}.${k}: wrong type: ${typeName(v)} ${JSON.stringify(v)}, want integer`);
          continue;
        }
      }
      walk(v, a.type, `${where}.${k}`);
    }
  }
}

// kubernetes-models' class for apiVersion/kind, or null.
async function kmClass(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const pkg = group === "monitoring.coreos.com" ? "@kubernetes-models/prometheus-operator"
    : group === "cert-manager.io" ? "@kubernetes-models/cert-manager" : "kubernetes-models";
  const root = path.dirname(require.resolve(pkg + "/package.json"));
  const file = path.join(root, ...(group ? [group] : []), version, kind + ".js");
  try {
    return (await import(pathToFileURL(file).href))[kind] || null;
  } catch {
    return null;
  }
}

const kinds = [];
for (const file of process.argv.slice(2)) {
  const docs = YAML.parseAllDocuments(readFileSync(file, "utf8"));
  for (const doc of docs) {
    if (doc.errors.length) {
      errors.push(`${file}: YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJSON();
    if (!obj) continue;
    const id = `${file}: ${obj.kind}/${obj.metadata && obj.metadata.name}`;
    if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
      errors.push(`${id}: no apiVersion/kind`);
      continue;
    }
    kinds.push(`${obj.apiVersion} ${obj.kind}`);
    const version = obj.apiVersion.split("/").pop();
    const modelName = version.charAt(0).toUpperCase() + version.slice(1) + obj.kind;
    const builtIn = !obj.apiVersion.includes(".") || obj.apiVersion.endsWith(".k8s.io/" + version);
    if (builtIn) {
      if (!models[modelName]) errors.push(`${id}: ${obj.apiVersion} ${obj.kind} is not a Kubernetes ${versions["@kubernetes/client-node"]} API type`);
      else walk(obj, modelName, id);
    }
    const own = builtIn ? null : localSchema(obj.apiVersion, obj.kind);
    if (own) {
      if (!own(obj)) {
        for (const e of own.errors) {
          const extra = e.params && e.params.additionalProperty ? `: "${e.params.additionalProperty}"` : "";
          errors.push(`${id}: ${e.instancePath || "/"} ${e.message}${extra}`);
        }
      }
      if (obj.metadata !== undefined) walk(obj.metadata, "V1ObjectMeta", `${id}.metadata`);
      continue;
    }
    const Cls = await kmClass(obj.apiVersion, obj.kind);
    if (!Cls) {
      errors.push(`${id}: no kubernetes-models schema for ${obj.apiVersion} ${obj.kind}`);
      continue;
    }
    try {
      new Cls(obj).validate();
    } catch (e) {
      errors.push(`${id}: ${e.message}`);
    }
  }
}
for (const e of errors) console.log("ERROR " + e);
if (errors.length) process.exit(1);
console.log(`OK ${kinds.length} objects (${[...new Set(kinds)].sort().join(", ")}); ` +
            `schemas: kubernetes-models ${versions["kubernetes-models"]}, @kubernetes/client-node ${versions["@kubernetes/client-node"]}`);
