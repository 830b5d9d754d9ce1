"""/metrics: the server's Prometheus metrics, in a registry of its own (one per app).

    ggml_server_http_requests_total{path, status}   responses by route and status code
    ggml_server_prompt_tokens_total                 prompt tokens added to the batch
    ggml_server_prompt_tokens_shared_total          of those, found in shared KV pages (not computed)
    ggml_server_generated_tokens_total              tokens generated
    ggml_server_steps_total                         batch steps that ran
    ggml_server_step_sequences                      histogram: sequences given a token per step
                                                    (above 1: requests shared the step)
    ggml_server_step_seconds                        histogram: time of a step
    ggml_server_sequences_total{finish_reason}      finished sequences: stop, length, cancelled
    ggml_server_tokens_per_second                   generated tokens/s, last 10 s
    ggml_server_sequences_running                   sequences in the batch, generating
    ggml_server_sequences_waiting                   admitted, waiting for room (the queue)
    ggml_server_kv_pages_used, _kv_pages_total      the paged KV cache's pool
    ggml_server_kv_pages_idle                       pages nobody holds that keep a prefix's rows
"""
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PREFIX = "ggml_server_"
STEP_SEQUENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServerMetrics:
    """The counters the scheduler and the HTTP layer update, and the gauges read from
    a scheduler (attach) when /metrics is asked."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.http = Counter(PREFIX + "http_requests", "HTTP responses by route and status",
                            ["path", "status"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "prompt tokens added to the batch",
                                     registry=r)
        self.prompt_tokens_shared = Counter(PREFIX + "prompt_tokens_shared",
                                            "prompt tokens found in shared KV pages (not computed)",
                                            registry=r)
        self.generated_tokens = Counter(PREFIX + "generated_tokens", "tokens generated",
                                        registry=r)
        self.steps = Counter(PREFIX + "steps", "batch steps run", registry=r)
        self.step_sequences = Histogram(PREFIX + "step_sequences",
                                        "sequences given a token in one step",
                                        buckets=STEP_SEQUENCE_BUCKETS, registry=r)
        self.step_seconds = Histogram(PREFIX + "step_seconds", "time of one batch step",
                                      registry=r)
        self.finished = Counter(PREFIX + "sequences", "finished sequences by finish reason",
                                ["finish_reason"], registry=r)

    def attach(self, scheduler):
        """Gauges that read the scheduler's figures when scraped."""
        r = self.registry
        gauges = {
            "tokens_per_second": ("generated tokens per second, last 10 s",
                                  scheduler.tokens_per_second),
            "sequences_running": ("sequences generating in the batch", lambda: scheduler.n_running),
            "sequences_waiting": ("sequences admitted and waiting for room",
                                  lambda: scheduler.n_waiting),
            "kv_pages_used": ("KV cache pages in use", lambda: scheduler.pages_used),
            "kv_pages_total": ("KV cache pages in the pool", lambda: scheduler.pages_total),
            "kv_pages_idle": ("KV cache pages nobody holds that keep a prefix's rows",
                              lambda: scheduler.pages_idle),
        }
        for name, (doc, read) in gauges.items():
            Gauge(PREFIX + name, doc, registry=r).set_function(read)

    def step(self, seconds, sequences, tokens):
        """Count one batch step: its time, the sequences it advanced, the tokens it made."""
        self.steps.inc()
        self.step_seconds.observe(seconds)
        if sequences:
            self.step_sequences.observe(sequences)
        self.generated_tokens.inc(tokens)

    def text(self):
        """The metrics in Prometheus' text format (bytes)."""
        return generate_latest(self.registry)
