import { runConformanceTests } from "@durable-streams/server-conformance-tests";

runConformanceTests({ baseUrl: process.env.CONFORMANCE_TEST_URL ?? "http://127.0.0.1:4437" });
