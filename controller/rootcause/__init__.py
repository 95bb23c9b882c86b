"""One root-cause chain for a slow job, across the layers qpmesh sees.

- `controller.rootcause.graph`: the job's cross-layer graph (job -> ranks -> GPUs, NICs ->
  links -> switches) from the job registry and the fabric.
- `controller.rootcause.classes`: what each hardware signal says about a cause (one table).
- `controller.rootcause.chain`: `explain` walks the graph with the anomalies
  (`controller.anomaly`) and the mesh's findings and names the most likely cause.
"""
