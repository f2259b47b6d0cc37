"""Quick start: a publisher in this process, subscribers in two Ray actors.

    python examples/quickstart.py            # starts an embedded local Ray
    RAY_ADDRESS=... python examples/quickstart.py   # or attaches to a running cluster
"""

import ray

import scopecast


@ray.remote(num_cpus=0)
class Printer:
    """A subscriber living in a Ray actor: it becomes a scopecast member when it subscribes."""

    def __init__(self, topic: str) -> None:
        self.cluster = scopecast.connect()
        self.sub = self.cluster.subscriber(topic)

    def ready(self) -> bool:
        return True  # the constructor has subscribed: messages published from now on arrive

    def take(self, n: int) -> list:
        return [(m.seq, m.value) for m in (self.sub.receive(timeout=10.0) for _ in range(n)) if m]

    def close(self) -> None:
        self.cluster.shutdown()


def main() -> None:
    cluster = scopecast.connect()
    cluster.create_topic("quickstart/prices")
    printers = [Printer.remote("quickstart/prices") for _ in range(2)]
    ray.get([p.ready.remote() for p in printers])  # subscribers see messages published after this
    results = [p.take.remote(5) for p in printers]
    with cluster.publisher("quickstart/prices") as pub:
        for i in range(5):
            pub.publish({"symbol": "XYZ", "price": 100 + i})
        pub.flush()
    for n, got in enumerate(ray.get(results), 1):
        print(f"subscriber {n}: {got}")
    ray.get([p.close.remote() for p in printers])
    cluster.shutdown()


if __name__ == "__main__":
    main()
