// Validates custom resources against their CRD schemas, as generated into
// @kubernetes-models: the Prometheus Operator's (ServiceMonitor, PodMonitor,
// PrometheusRule) and cert-manager's (Certificate, Issuer). Usage: node k8s-crds.mjs NODE_DIR FILE.json...
// where each FILE.json holds a JSON array of Kubernetes objects. Those schemas, like
// the CRDs they come from, check types, required fields and patterns, but do not
// reject unknown fields (the API server prunes them instead).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [dir, ...files] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(`${dir}/node_modules/@kubernetes-models/${path}/index.js`).href);
const models = {
  "monitoring.coreos.com/v1": await load("prometheus-operator/monitoring.coreos.com/v1"),
  "cert-manager.io/v1": await load("cert-manager/cert-manager.io/v1"),
};
let checked = 0;
let failed = 0;
for (const file of files) {
  for (const obj of JSON.parse(readFileSync(file, "utf8"))) {
    const group = models[obj.apiVersion];
    if (!group) continue;
    const Model = group[obj.kind];
    if (!Model) { console.error(`FAIL: ${file}: unknown kind ${obj.kind}`); failed++; continue; }
    try {
      new Model(obj).validate();
      console.log(`ok: ${file}: ${obj.kind}/${obj.metadata.name} matches the CRD schema`);
      checked++;
    } catch (e) {
      console.error(`FAIL: ${file}: ${obj.kind}/${obj.metadata.name}: ${e.message}`);
      failed++;
    }
  }
}
if (failed || !checked) { console.error(`FAIL: ${failed} invalid, ${checked} valid`); process.exit(1); }
