package main

// What every subcommand says when it is called wrongly, and the exit code it then returns.

const usage = `usage:
  gitops argocd-health-test DIR
  gitops argocd-health [--dir DIR] FILE|-
  gitops kstatus FILE|-
  gitops flux-apply-wait --kubeconfig FILE [--timeout 60s] [--interval 5s] [--fail-fast] FILES...
`

// exitUsage is the exit code of usage, read and connection errors (1 and 2 have meanings).
const exitUsage = 3
