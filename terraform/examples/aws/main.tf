# Cornus on EKS over DynamoDB: the table and the IRSA role (../../modules/aws), and the chart
# (helm/cornus) installed with the module's values; no credential leaves AWS.

provider "aws" {
  region = var.region
}

data "aws_eks_cluster" "eks" {
  name = var.eks_cluster_name
}

data "aws_iam_openid_connect_provider" "eks" {
  url = data.aws_eks_cluster.eks.identity[0].oidc[0].issuer
}

# A token per call, from the AWS CLI (as `aws eks update-kubeconfig` sets up): an
# aws_eks_cluster_auth token is read once at refresh and lasts 15 minutes, which a plan, a refresh
# and the release's own wait (up to 15 minutes) outlast.
provider "helm" {
  kubernetes {
    host                   = data.aws_eks_cluster.eks.endpoint
    cluster_ca_certificate = base64decode(data.aws_eks_cluster.eks.certificate_authority[0].data)
    exec {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", var.eks_cluster_name, "--region", var.region]
    }
  }
}

locals {
  release = "cornus"
}

module "storage" {
  source            = "../../modules/aws"
  name              = var.name
  oidc_provider_arn = data.aws_iam_openid_connect_provider.eks.arn
  oidc_issuer       = replace(data.aws_eks_cluster.eks.identity[0].oidc[0].issuer, "https://", "")
  namespace         = var.namespace
  # The chart names its ServiceAccount after the release's fullname ("cornus" for release cornus).
  service_account_name = local.release
}

resource "helm_release" "cornus" {
  name             = local.release
  namespace        = var.namespace
  create_namespace = true
  chart            = "${path.module}/../../../helm/cornus"
  # Waits for every pod's readiness and for the rebalance hook.
  wait    = true
  timeout = 900

  values = [
    yamlencode(module.storage.helm_values),
    yamlencode({
      replicaCount   = var.replica_count
      partitionCount = var.partition_count
      image = {
        repository = var.image_repository
        digest     = var.image_digest
      }
      storage = {
        dynamodb = {
          region = var.region
        }
      }
    }),
  ]
}
