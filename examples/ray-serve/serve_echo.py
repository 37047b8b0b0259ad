"""The Ray Serve app of examples/ray-serve.toml: an echo deployment with a replica on each
Ray node of the unit. It reaches each head as an artifact (`flotilla artifact push
examples/ray-serve/serve_echo.py`), not inline in the spec: change it, push it, and put its
new sha256 in the spec; `flotilla apply` then rolls the units make before break."""
import os, sys, time
import ray
from ray import serve

ip = os.environ.get("RAY_NODE_IP", "127.0.0.1")
gcs = os.environ["FLOTILLA_PORT_GCS"]
for _ in range(600):
    try:
        ray.init(address=f"{ip}:{gcs}", logging_level="ERROR", log_to_driver=False)
        break
    except Exception:
        time.sleep(0.5)
else:
    sys.exit("the head never answered")

# Two replicas, one per Ray node: one on the head, one on the worker.
@serve.deployment(num_replicas=2, max_replicas_per_node=1, ray_actor_options={"num_cpus": 0.1})
class Echo:
    async def __call__(self, request):
        body = await request.body()
        return {
            "unit": os.environ.get("FLOTILLA_UNIT"),
            "replica_node": ray.get_runtime_context().get_node_id()[:8],
            "path": request.url.path,
            "echo": body.decode(errors="replace"),
        }

serve.start(http_options={"host": ip, "port": int(os.environ["FLOTILLA_PORT_SERVE"])}, proxy_location="HeadOnly")
serve.run(Echo.bind(), name="echo", route_prefix="/", blocking=False)
print("the Serve app is deployed", flush=True)
