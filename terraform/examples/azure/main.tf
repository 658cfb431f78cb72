# Cornus on AKS over Azure Blob Storage: the storage (../../modules/azure), the connection string
# in a Kubernetes Secret, and the chart (helm/cornus) installed with the module's values.

provider "azurerm" {
  features {}
  subscription_id = var.subscription_id
}

data "azurerm_kubernetes_cluster" "aks" {
  name                = var.aks_cluster_name
  resource_group_name = var.aks_resource_group_name
}

locals {
  kube = data.azurerm_kubernetes_cluster.aks.kube_config[0]
  # Entra ID sign-in through kubelogin and the Azure CLI's login, as AKS recommends: a cluster
  # with Entra ID integration and local accounts disabled issues no client certificate, and one
  # that does issues a cluster-wide credential that should not sit in Terraform state. The
  # server id is the AKS Entra ID server application's, the same in every tenant.
  kube_exec = {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "kubelogin"
    args        = ["get-token", "--login", "azurecli", "--server-id", "6dae42f8-4368-4678-94ff-3960e28e3630"]
  }
}

provider "kubernetes" {
  host                   = local.kube.host
  cluster_ca_certificate = base64decode(local.kube.cluster_ca_certificate)
  exec {
    api_version = local.kube_exec.api_version
    command     = local.kube_exec.command
    args        = local.kube_exec.args
  }
}

provider "helm" {
  kubernetes {
    host                   = local.kube.host
    cluster_ca_certificate = base64decode(local.kube.cluster_ca_certificate)
    exec {
      api_version = local.kube_exec.api_version
      command     = local.kube_exec.command
      args        = local.kube_exec.args
    }
  }
}

module "storage" {
  source             = "../../modules/azure"
  name               = var.name
  location           = var.location
  allowed_subnet_ids = [var.aks_subnet_id]
}

resource "kubernetes_namespace" "cornus" {
  metadata {
    name = var.namespace
  }
}

# The chart reads credentials only from a Secret it is given the name of.
resource "kubernetes_secret" "storage" {
  metadata {
    name      = "cornus-azure-blob"
    namespace = kubernetes_namespace.cornus.metadata[0].name
  }
  data = {
    "connection-string" = module.storage.storage_connection_string
  }
}

resource "helm_release" "cornus" {
  name      = "cornus"
  namespace = kubernetes_namespace.cornus.metadata[0].name
  chart     = "${path.module}/../../../helm/cornus"
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
        azureBlob = {
          existingSecret = kubernetes_secret.storage.metadata[0].name
        }
      }
    }),
  ]
}
