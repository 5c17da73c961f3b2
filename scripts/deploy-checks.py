#!/usr/bin/env python3
"""Assertions of scripts/check-deploy that need a YAML parser.

Subcommands (each exits 1 with "FAILED: ..." lines on stderr when an assertion fails):

  seed-verbatim VALUES SEED     the values file (less its leading comments) appears verbatim
                                in the seed document
  manifests KIND FILE [VALUES]  assertions on `helm template` output; KIND is default, seed
                                or all-features, VALUES the values file it was rendered with
  config FILE NAME OUT          write the data key NAME of the rendered ConfigMaps to OUT
  probes FILE                   print "component port-name path" for every probe and
                                ServiceMonitor endpoint of the rendered manifests
  dashboard FILE OUT            structural checks of the Grafana dashboard; writes its
                                queries as a Prometheus rules file to OUT for promtool
  metric-names SCRAPE... -- RULES DASHBOARD
                                every metric a rule or panel uses is in one of the scrapes

It runs under the tools venv of scripts/check-deploy (PyYAML comes with yamllint).
"""

import json
import re
import sys
import tomllib

import yaml

FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
    return condition


def finish(what):
    if FAILURES:
        for f in FAILURES:
            print(f"FAILED: {what}: {f}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def component(obj):
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def pod_labels(workload):
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def config_of(docs, key):
    for cm in by_kind(docs, "ConfigMap").values():
        if key in cm.get("data", {}):
            return tomllib.loads(cm["data"][key])
    return None


# ---------------------------------------------------------------------------------------
def seed_verbatim(values_path, seed_path):
    with open(values_path) as f:
        lines = f.read().splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    block = "\n".join(lines).strip("\n")
    with open(seed_path) as f:
        seed = f.read()
    check(block and block in seed,
          f"{values_path} is not a verbatim copy of the values block in {seed_path}")
    finish("seed values are the seed document's block")


# ---------------------------------------------------------------------------------------
def common_manifest_checks(docs):
    """What every rendering must have: one server with its volume, probes and hardening."""
    sts = by_kind(docs, "StatefulSet")
    if not check(len(sts) == 1, f"expected one StatefulSet, found {sorted(sts)}"):
        return None
    server = next(iter(sts.values()))
    spec = pod_spec(server)
    check(server["spec"]["replicas"] == 1, "the server StatefulSet must have replicas: 1")
    config = config_of(docs, "ursula.toml")
    if not check(config is not None, "no ConfigMap renders ursula.toml"):
        return server
    (container,) = spec["containers"]
    check(container["command"][:2] == ["ursula", "server"], "server command is not `ursula server`")
    config_flag = container["command"].index("--config") + 1
    config_path = container["command"][config_flag]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    check(config_path.rsplit("/", 1)[0] in mounts, f"{config_path} is not on a mounted volume")
    data_dir = config.get("data_dir")
    check(mounts.get(data_dir) == "data", f"data_dir {data_dir} is not the volume claim 'data'")
    claims = [c["metadata"]["name"] for c in server["spec"].get("volumeClaimTemplates", [])]
    check(claims == ["data"], f"volumeClaimTemplates are {claims}, expected ['data']")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    check(config["listen"] == f"0.0.0.0:{ports.get('http')}", "listen does not match port http")
    check(config.get("metrics_listen") == f"0.0.0.0:{ports.get('metrics')}",
          "metrics_listen does not match port metrics")
    probes = {k: container.get(k, {}).get("httpGet", {}).get("path")
              for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    check(probes == {"startupProbe": "/__ursula/healthz", "livenessProbe": "/__ursula/healthz",
                     "readinessProbe": "/__ursula/readyz"}, f"server probes are {probes}")
    scheme = "HTTPS" if "tls_cert" in config else "HTTP"
    for k in probes:
        check(container[k]["httpGet"].get("scheme") == scheme, f"{k} scheme is not {scheme}")
    pod_sc = spec.get("securityContext", {})
    sc = container.get("securityContext", {})
    check(pod_sc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is True,
          "server must run as non-root")
    check(sc.get("readOnlyRootFilesystem") is True, "server root file system must be read-only")
    check(sc.get("allowPrivilegeEscalation") is False, "server must not escalate privileges")
    check("ALL" in sc.get("capabilities", {}).get("drop", []), "server must drop all capabilities")
    check(bool(container.get("resources", {}).get("requests")), "server has no resource requests")
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    check(writable == {data_dir, "/tmp"}, f"server's writable mounts are {sorted(writable)}")
    for path_key in ("tls_cert", "tls_key", "auth_token_file"):
        if path_key in config:
            directory = config[path_key].rsplit("/", 1)[0]
            check(directory in mounts, f"{path_key} {config[path_key]} is not on a mounted volume")
    pdbs = [p for p in by_kind(docs, "PodDisruptionBudget").values()
            if selects(p["spec"]["selector"]["matchLabels"], pod_labels(server))]
    check(len(pdbs) == 1, "no PodDisruptionBudget selects the server pod")
    return server


def service_for(docs, name, port, workload):
    svc = by_kind(docs, "Service").get(name)
    if not check(svc is not None, f"no Service named {name}"):
        return
    (container,) = pod_spec(workload)["containers"]
    container_ports = {p["name"] for p in container["ports"]}
    match = [p for p in svc["spec"]["ports"] if p["port"] == port]
    if check(match, f"Service {name} has no port {port}"):
        check(match[0]["targetPort"] in container_ports,
              f"Service {name} port {port} targets {match[0]['targetPort']}, not a container port")
    check(selects(svc["spec"]["selector"], pod_labels(workload)),
          f"Service {name} does not select the pods of {workload['metadata']['name']}")


def indexer_checks(docs, values):
    deployments = by_kind(docs, "Deployment")
    indexer = deployments.get("ursula-indexer")
    if not check(indexer is not None, f"no Deployment ursula-indexer (found {sorted(deployments)})"):
        return
    want = values["indexer"]
    check(indexer["spec"]["replicas"] == want["replicaCount"],
          f"indexer replicas {indexer['spec']['replicas']}, values say {want['replicaCount']}")
    spec = pod_spec(indexer)
    accounts = by_kind(docs, "ServiceAccount")
    account = accounts.get(spec.get("serviceAccountName"))
    if check(account is not None, f"indexer service account {spec.get('serviceAccountName')} is not rendered"):
        annotations = account["metadata"].get("annotations", {})
        for k, v in want.get("serviceAccount", {}).get("annotations", {}).items():
            check(annotations.get(k) == v, f"indexer service account lacks annotation {k}: {v}")
    config = config_of(docs, "ursula-indexer.toml")
    if check(config is not None, "no ConfigMap renders ursula-indexer.toml"):
        check(config.get("s3_bucket") == values["s3"]["bucket"],
              f"indexer s3_bucket {config.get('s3_bucket')} != {values['s3']['bucket']}")
        if "region" in values["s3"]:
            check(config.get("s3_region") == values["s3"]["region"], "indexer s3_region differs")
        if "prefix" in want.get("s3", {}):
            check(config.get("s3_prefix") == want["s3"]["prefix"],
                  f"indexer s3_prefix {config.get('s3_prefix')} != {want['s3']['prefix']}")
        check("store_dir" not in config, "an indexer pool must not use a local store directory")
        server_config = config_of(docs, "ursula.toml") or {}
        check("auth_token_file" not in server_config or "server_token_file" in config,
              "the server requires tokens and the indexer has no server_token_file")
    (container,) = spec["containers"]
    check(container["command"][0] == "ursula-indexer", "indexer command is not ursula-indexer")
    check("$(POD_NAME)" in container["command"], "indexer worker id is not the pod name")
    sc = container.get("securityContext", {})
    check(sc.get("readOnlyRootFilesystem") is True and sc.get("runAsNonRoot") is True,
          "indexer must run non-root on a read-only root file system")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    if config:
        check(config.get("cache_dir") in mounts, "indexer cache_dir is not a mounted volume")
        for path_key in ("tls_cert", "tls_key", "source_ca_file", "server_token_file"):
            if path_key in config:
                directory = config[path_key].rsplit("/", 1)[0]
                check(directory in mounts, f"indexer {path_key} {config[path_key]} is not on a mounted volume")
    probes = {k: container.get(k, {}).get("httpGet", {}).get("path")
              for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    check(probes == {"startupProbe": "/livez", "livenessProbe": "/livez",
                     "readinessProbe": "/readyz"}, f"indexer probes are {probes}")
    service_for(docs, "ursula-indexer", 4493, indexer)


def service_monitor_checks(docs):
    monitors = by_kind(docs, "ServiceMonitor")
    check(len(monitors) >= 1, "no ServiceMonitor rendered")
    services = by_kind(docs, "Service").values()
    for name, sm in monitors.items():
        selected = [s for s in services
                    if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        check(len(selected) == 1, f"ServiceMonitor {name} selects {len(selected)} Services, expected 1")
        for endpoint in sm["spec"]["endpoints"]:
            check(endpoint.get("path") == "/metrics", f"ServiceMonitor {name} path is not /metrics")
            for svc in selected:
                names = {p["name"] for p in svc["spec"]["ports"]}
                check(endpoint["port"] in names,
                      f"ServiceMonitor {name} port {endpoint['port']} is not a port of {svc['metadata']['name']}")


def manifests(kind, path, values_path=None):
    docs = load_all(path)
    values = {}
    if values_path:
        with open(values_path) as f:
            values = yaml.safe_load(f)
    server = common_manifest_checks(docs)
    if server:
        service_for(docs, "ursula-gateway", 4437, server)
    if kind == "default":
        check("Deployment" not in {d["kind"] for d in docs}, "indexer rendered while disabled")
        check(not by_kind(docs, "ServiceMonitor"), "ServiceMonitor rendered while disabled")
    elif kind == "seed":
        indexer_checks(docs, values)
        # The seed's literal asks, in case the values file and the checks drift together.
        dep = by_kind(docs, "Deployment").get("ursula-indexer", {})
        check(dep.get("spec", {}).get("replicas") == 2, "seed: indexer replicas is not 2")
        account = by_kind(docs, "ServiceAccount").get("ursula-indexer", {})
        check(account.get("metadata", {}).get("annotations", {}).get("eks.amazonaws.com/role-arn")
              == "arn:aws:iam::123456789012:role/ursula-telemetry-index",
              "seed: the indexer's role-arn annotation is missing")
        config = config_of(docs, "ursula-indexer.toml") or {}
        check(config.get("s3_prefix") == "production/telemetry-indexes", "seed: S3 prefix")
        check(config.get("s3_bucket") == "my-telemetry-index", "seed: S3 bucket")
    elif kind == "all-features":
        indexer_checks(docs, values)
        service_monitor_checks(docs)
        for name in ("ursula", "ursula-indexer"):
            workload = by_kind(docs, "StatefulSet").get(name) or by_kind(docs, "Deployment").get(name)
            env = {e["name"]: e for e in pod_spec(workload)["containers"][0].get("env", [])}
            check(env.get("AWS_SECRET_ACCESS_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name")
                  == values["s3"]["existingSecret"], f"{name} does not read the S3 secret")
        config = config_of(docs, "ursula.toml")
        cold = config.get("cold_tier", {})
        check(cold.get("s3_bucket") == values["s3"]["bucket"], "cold tier bucket")
        check(cold.get("s3_prefix") == values["server"]["coldTier"]["prefix"], "cold tier prefix")
        for k, v in values["server"]["config"].items():
            check(config.get(k) == v and type(config.get(k)) is type(v),
                  f"server config key {k}: rendered {config.get(k)!r}, values {v!r}")
    else:
        check(False, f"unknown manifest kind {kind}")
    finish(f"rendered manifests ({kind})")


def extract_config(path, key, out):
    docs = load_all(path)
    for cm in by_kind(docs, "ConfigMap").values():
        if key in cm.get("data", {}):
            with open(out, "w") as f:
                f.write(cm["data"][key])
            return
    print(f"FAILED: no ConfigMap with {key} in {path}", file=sys.stderr)
    sys.exit(1)


def probes(path):
    """Every HTTP path the cluster will call, per component, for the live check."""
    docs = load_all(path)
    for w in list(by_kind(docs, "StatefulSet").values()) + list(by_kind(docs, "Deployment").values()):
        c = pod_spec(w)["containers"][0]
        for k in ("startupProbe", "livenessProbe", "readinessProbe"):
            g = c[k]["httpGet"]
            print(component(w), g["port"], g["path"])
    for sm in by_kind(docs, "ServiceMonitor").values():
        for endpoint in sm["spec"]["endpoints"]:
            print(component(sm), endpoint["port"], endpoint["path"])


# ---------------------------------------------------------------------------------------
GRAFANA_SUBSTITUTES = {"$__rate_interval": "1m", "$instance": ".*", "$index": ".*"}


def dashboard_queries(d):
    """(panel title, expr) of every panel target."""
    for p in d["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t.get("expr", "")


def dashboard(path, out):
    with open(path) as f:
        d = json.load(f)  # invalid JSON raises here, with the position
    check(d.get("uid") and d.get("title"), "dashboard needs a uid and a title")
    ids = [p["id"] for p in d["panels"]]
    check(len(ids) == len(set(ids)), "panel ids are not unique")
    cells = {}
    for p in d["panels"]:
        g = p["gridPos"]
        check(g["x"] + g["w"] <= 24, f"panel {p['title']} is wider than the grid")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                other = cells.setdefault((x, y), p["title"])
                check(other == p["title"], f"panels {other} and {p['title']} overlap")
        if p["type"] != "row":
            check(p.get("targets"), f"panel {p['title']} has no query")
            check(p.get("datasource", {}).get("uid") == "${datasource}",
                  f"panel {p['title']} does not use the datasource variable")
    variables = {v["name"] for v in d["templating"]["list"]}
    rules = []
    for title, expr in dashboard_queries(d):
        check(expr.strip(), f"panel {title} has an empty query")
        for var in re.findall(r"\$[a-zA-Z_]+", expr):
            check(var in GRAFANA_SUBSTITUTES, f"panel {title} uses {var}, which the check does not know")
            check(var == "$__rate_interval" or var[1:] in variables,
                  f"panel {title} uses {var}, which is not a dashboard variable")
        for var, value in GRAFANA_SUBSTITUTES.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"dashboard:query_{len(rules)}", "expr": expr})
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for topic in ("appends/s", "append bytes/s", "append latency", "commit size", "write budget",
                  "disk space left", "resident memory", "version", "read cache hit ratio",
                  "archive lag", "freshness", "skipped"):
        check(topic in titles, f"no panel about {topic!r}")
    with open(out, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, f)
    finish(f"dashboard structure ({len(rules)} queries)")


# PromQL words that are not metric names: keywords, and aggregation operators (which may be
# followed by a grouping clause instead of their parenthesis).
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "and", "or", "unless", "offset", "inf", "nan", "atan2"}
PROMQL_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                       "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}


def metric_names(expr):
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names or label values."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, templates)
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range and subquery durations
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\$[a-zA-Z_]+", "", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word, rest = m.group(0), e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if word.lower() in PROMQL_KEYWORDS | PROMQL_AGGREGATIONS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # the exponent or unit of a number
        names.add(word)
    return names


def scraped_names(path):
    names = set()
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def metric_names_check(scrapes, rules_path, dashboard_path):
    exported = set()
    for s in scrapes:
        got = scraped_names(s)
        check(got, f"scrape {s} holds no samples")
        exported |= got
    with open(rules_path) as f:
        rules = yaml.safe_load(f)
    recorded = set()
    used = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                recorded.add(rule["record"])
            for n in metric_names(str(rule["expr"])):
                used.setdefault(n, set()).add(rule.get("alert") or rule.get("record"))
    with open(dashboard_path) as f:
        d = json.load(f)
    for title, expr in dashboard_queries(d):
        for n in metric_names(expr):
            used.setdefault(n, set()).add(f"panel '{title}'")
    for v in d["templating"]["list"]:
        m = re.match(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", str(v.get("definition", "")))
        if m:
            used.setdefault(m.group(1), set()).add(f"variable ${v['name']}")
    # A self-test of the extraction, so that a parser that finds nothing cannot pass.
    check(len(used) >= 30, f"only {len(used)} metric names found in the rules and the dashboard")
    for histogram in ("ursula_storage_commit_write_duration_seconds_bucket",
                      "ursula_append_duration_seconds_bucket"):
        check(histogram in used, f"the extraction missed the histogram {histogram}")
    for name, users in sorted(used.items()):
        if name in recorded:
            continue
        check(name in exported,
              f"{name} (used by {', '.join(sorted(users))}) is not exported by the live binaries")
    finish(f"{len(used)} metric names used by the rules and the dashboard are exported")


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "seed-verbatim":
        seed_verbatim(*args)
    elif cmd == "manifests":
        manifests(*args)
    elif cmd == "config":
        extract_config(*args)
    elif cmd == "probes":
        probes(*args)
    elif cmd == "dashboard":
        dashboard(*args)
    elif cmd == "metric-names":
        split = args.index("--")
        metric_names_check(args[:split], *args[split + 1:])
    else:
        print(f"unknown subcommand {cmd}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
