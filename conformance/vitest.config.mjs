import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["ds.test.mjs"],
    // The suite relies on vitest's 5 s default for most tests; under CPU contention
    // (builds sharing the 2 cores) that turns load into false failures (notes/peers.md).
    testTimeout: 20000,
    hookTimeout: 20000,
  },
});
