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
}

provider "kubernetes" {
  host                   = local.kube.host
  client_certificate     = base64decode(local.kube.client_certificate)
  client_key             = base64decode(local.kube.client_key)
  cluster_ca_certificate = base64decode(local.kube.cluster_ca_certificate)
}

provider "helm" {
  kubernetes {
    host                   = local.kube.host
    client_certificate     = base64decode(local.kube.client_certificate)
    client_key             = base64decode(local.kube.client_key)
    cluster_ca_certificate = base64decode(local.kube.cluster_ca_certificate)
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
