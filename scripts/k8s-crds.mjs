// Validates Prometheus Operator custom resources (ServiceMonitor, PodMonitor,
// PrometheusRule) against the operator's CRD schemas, as generated into
// @kubernetes-models/prometheus-operator. Usage: node k8s-crds.mjs NODE_DIR FILE.json...
// where each FILE.json holds a JSON array of Kubernetes objects. Those schemas, like
// the CRDs they come from, check types, required fields and patterns, but do not
// reject unknown fields (the API server prunes them instead).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [dir, ...files] = process.argv.slice(2);
const v1 = await import(pathToFileURL(
  `${dir}/node_modules/@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js`).href);
let checked = 0;
let failed = 0;
for (const file of files) {
  for (const obj of JSON.parse(readFileSync(file, "utf8"))) {
    if (obj.apiVersion !== "monitoring.coreos.com/v1") continue;
    const Model = v1[obj.kind];
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
