"""torch.profiler (Kineto/CUPTI) adapter: read the chrome trace the harness exported into shared records."""
