"""The ground floor and the config floor's pure parts: batching, the layers of the package, the registry, fingerprints."""
