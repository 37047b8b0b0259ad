#!/usr/bin/env python3
"""Ray autoscaler v2's own ResourceDemandScheduler on a Flotilla demand file.

    ray_plan.py DEMAND.json

Reads the file `flotilla autoscale plan --demand` reads (the shape of Ray autoscaler
v2's scheduling request; see examples/README.md), builds Ray's `SchedulingRequest` from
it the way Ray's GCS and autoscaler would, runs
`ResourceDemandScheduler().schedule(...)` once and prints one JSON line:

    {"decision_seconds", "nodes_total", "nodes_by_type", "waste": {resource: fraction},
     "infeasible", "ray_version"}

Only `schedule()` is timed: not the imports, the file, or building the request.
No Ray cluster is needed; the scheduler is a pure class. Tested with `ray==2.60.0`.

Mapping (what Ray's GCS sends the autoscaler):
- node_types -> NodeTypeConfig(name, min_worker_nodes, max_worker_nodes (default:
  max_total_workers), resources, labels, idle_timeout_s); `cost` has no Ray counterpart;
- max_total_workers -> SchedulingRequest.max_num_nodes;
- resource_requests -> ResourceRequestByCount;
- gang_requests -> GangResourceRequest, one ResourceRequest per bundle: STRICT_SPREAD
  bundles carry an anti-affinity constraint on the label `_PG_<id>`, STRICT_PACK bundles
  an affinity constraint on it (Ray merges those into one request), PACK and SPREAD
  bundles none (the GCS exports them without constraints);
- cluster_resource_constraints -> one ClusterResourceConstraint (Ray takes at most one;
  several are concatenated);
- current_instances -> `count` AutoscalerInstances, each an IM instance in RAY_RUNNING
  with a matching Ray node (total = the type's resources, available = `available` if
  given, else the total; labels the type's; idle for `idle_s`).

Waste: for each resource, 1 - (demand placed on the cluster / capacity of the launched
nodes), where the demand placed is every request, gang bundle and nothing of the
constraints, minus what Ray reports infeasible. With no current instances (the loadtest's
scenario) this is exactly the unused fraction of the new nodes; with current instances it
counts demand that landed on them as if it used new capacity (a lower bound, at least 0).
"""

import json
import logging
import sys
import time
import uuid


def fail(msg, code=2):
    print(json.dumps({"error": msg}))
    sys.exit(code)


def num(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        fail(f"{what}: expected a number, got {v!r}")
    if v < 0:
        fail(f"{what}: negative")
    return float(v)


def resources(d, what):
    if not isinstance(d, dict):
        fail(f"{what}: expected an object of resources")
    return {str(k): num(v, f"{what}.{k}") for k, v in d.items()}


def main():
    if len(sys.argv) != 2:
        fail("usage: ray_plan.py DEMAND.json")
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{sys.argv[1]}: {e}")

    try:
        import ray
        from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
        from ray.autoscaler.v2.scheduler import (
            ResourceDemandScheduler,
            SchedulingRequest,
        )
        from ray.autoscaler.v2.schema import AutoscalerInstance
        from ray.core.generated.autoscaler_pb2 import (
            AffinityConstraint,
            AntiAffinityConstraint,
            ClusterResourceConstraint,
            GangResourceRequest,
            NodeState,
            PlacementConstraint,
            ResourceRequest,
            ResourceRequestByCount,
        )
        from ray.core.generated.instance_manager_pb2 import Instance, NodeKind
    except Exception as e:  # ImportError, or a broken install
        # Exit code 3: Ray is not installed here (the loadtest reports Ray as absent).
        fail(f"import ray failed: {type(e).__name__}: {e}", 3)
    # The scheduler logs each min_workers launch at INFO; keep stdout/stderr quiet.
    logging.getLogger("ray").setLevel(logging.WARNING)

    max_total = doc.get("max_total_workers")
    types = {}
    for t in doc.get("node_types", []):
        name = t["name"]
        # As in Ray's cluster config, a type's max_workers defaults to the cluster's.
        default_max = max_total if max_total is not None else 10_000_000
        types[name] = NodeTypeConfig(
            name=name,
            min_worker_nodes=int(t.get("min_workers", 0)),
            max_worker_nodes=int(t.get("max_workers", default_max)),
            idle_timeout_s=t.get("idle_timeout_s"),
            resources=resources(t.get("resources", {}), f"node type {name}"),
            labels={str(k): str(v) for k, v in t.get("labels", {}).items()},
        )

    demand = {}

    def add_demand(res, count):
        for k, v in res.items():
            demand[k] = demand.get(k, 0.0) + v * count

    def request(res, constraint=None):
        r = ResourceRequest()
        for k, v in res.items():
            if v > 0:
                r.resources_bundle[k] = v
        if constraint is not None:
            r.placement_constraints.append(constraint)
        return r

    resource_requests = []
    for i, rr in enumerate(doc.get("resource_requests", [])):
        res = resources(rr.get("resources", {}), f"resource_requests[{i}]")
        count = int(rr.get("count", 1))
        add_demand(res, count)
        resource_requests.append(ResourceRequestByCount(request=request(res), count=count))

    gang_requests = []
    gang_bundles = {}
    for i, g in enumerate(doc.get("gang_requests", [])):
        gid = str(g.get("id", f"gang-{i}"))
        strategy = g.get("strategy", "PACK")
        label = f"_PG_{gid}"
        bundles = [resources(b, f"gang {gid} bundle") for b in g.get("bundles", [])]
        reqs = []
        for b in bundles:
            if strategy == "STRICT_SPREAD":
                c = PlacementConstraint(
                    anti_affinity=AntiAffinityConstraint(label_name=label, label_value="")
                )
            elif strategy == "STRICT_PACK":
                c = PlacementConstraint(
                    affinity=AffinityConstraint(label_name=label, label_value="")
                )
            elif strategy in ("PACK", "SPREAD"):
                c = None
            else:
                fail(f"gang {gid}: unknown strategy {strategy!r}")
            reqs.append(request(b, c))
            add_demand(b, 1)
        details = f"{gid}:{strategy}"
        gang_bundles[details] = bundles
        gang_requests.append(GangResourceRequest(requests=reqs, details=details))

    constraint_reqs = []
    for i, c in enumerate(doc.get("cluster_resource_constraints", [])):
        for j, rr in enumerate(c.get("resource_requests", [])):
            res = resources(rr.get("resources", {}), f"constraint[{i}][{j}]")
            constraint_reqs.append(
                ResourceRequestByCount(request=request(res), count=int(rr.get("count", 1)))
            )
    constraints = (
        [ClusterResourceConstraint(resource_requests=constraint_reqs)]
        if constraint_reqs
        else []
    )

    instances = []
    for i, ci in enumerate(doc.get("current_instances", [])):
        ty = ci["node_type"]
        if ty not in types:
            fail(f"current_instances[{i}]: unknown node type {ty!r}")
        total = dict(types[ty].resources)
        avail = resources(ci["available"], f"current_instances[{i}].available") if "available" in ci else total
        for _ in range(int(ci.get("count", 1))):
            node_id = uuid.uuid4()
            instances.append(
                AutoscalerInstance(
                    im_instance=Instance(
                        instance_id=str(uuid.uuid4()),
                        instance_type=ty,
                        status=Instance.RAY_RUNNING,
                        node_id=node_id.hex,
                        node_kind=NodeKind.WORKER,
                    ),
                    ray_node=NodeState(
                        node_id=node_id.bytes,
                        ray_node_type_name=ty,
                        total_resources=total,
                        available_resources=avail,
                        labels=dict(types[ty].labels),
                        idle_duration_ms=int(float(ci.get("idle_s", 0)) * 1000),
                    ),
                    cloud_instance_id=f"cloud-{node_id.hex}",
                )
            )

    req = SchedulingRequest(
        disable_launch_config_check=True,
        node_type_configs=types,
        max_num_nodes=int(max_total) if max_total is not None else None,
        resource_requests=resource_requests,
        gang_resource_requests=gang_requests,
        cluster_resource_constraints=constraints,
        current_instances=instances,
    )

    scheduler = ResourceDemandScheduler()
    t0 = time.perf_counter()
    reply = scheduler.schedule(req)
    seconds = time.perf_counter() - t0

    by_type = {}
    for lr in reply.to_launch:
        by_type[lr.instance_type] = by_type.get(lr.instance_type, 0) + lr.count
    launched = {}
    for ty, n in by_type.items():
        for k, v in types[ty].resources.items():
            launched[k] = launched.get(k, 0.0) + v * n

    placed = dict(demand)
    for r in reply.infeasible_resource_requests:
        for k, v in r.resources_bundle.items():
            placed[k] = placed.get(k, 0.0) - v
    for g in reply.infeasible_gang_resource_requests:
        for b in gang_bundles.get(g.details, []):
            for k, v in b.items():
                placed[k] = placed.get(k, 0.0) - v
    waste = {
        k: max(0.0, 1.0 - placed.get(k, 0.0) / cap)
        for k, cap in sorted(launched.items())
        if cap > 0
    }
    print(
        json.dumps(
            {
                "decision_seconds": seconds,
                "nodes_total": sum(by_type.values()),
                "nodes_by_type": dict(sorted(by_type.items())),
                "waste": waste,
                "launched": dict(sorted(launched.items())),
                "infeasible": len(reply.infeasible_resource_requests)
                + len(reply.infeasible_gang_resource_requests)
                + len(reply.infeasible_cluster_resource_constraints),
                "infeasible_requests": len(reply.infeasible_resource_requests),
                "infeasible_gangs": len(reply.infeasible_gang_resource_requests),
                "infeasible_constraints": len(reply.infeasible_cluster_resource_constraints),
                "ray_version": ray.__version__,
            },
            separators=(",", ":"),
        )
    )


if __name__ == "__main__":
    main()
