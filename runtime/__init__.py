"""cpplan's runtime: runs a `planner.Plan` on a JAX mesh with the splash attention kernel."""
