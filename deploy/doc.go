// Package deploy holds credbroker's deployment examples: deploy/compose
// (broker and PostgreSQL with Compose) and deploy/kubernetes (two replicas
// on PostgreSQL). It has no code; its tests check the container image built
// from the repository's Dockerfile (TestDockerfile, TestImage) and decode
// every manifest strictly into the real Kubernetes and Compose types.
// docs/DEPLOY.md walks through a deployment.
package deploy
