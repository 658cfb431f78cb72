variable "subscription_id" {
  description = "The Azure subscription to create the storage in."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name (3-16 lowercase letters and digits)."
  type        = string
}

variable "location" {
  description = "Azure region of the storage, the cluster's region."
  type        = string
}

variable "aks_cluster_name" {
  description = "The existing AKS cluster that runs Cornus."
  type        = string
}

variable "aks_resource_group_name" {
  description = "The AKS cluster's resource group."
  type        = string
}

variable "aks_subnet_id" {
  description = "The AKS node subnet (with the Microsoft.Storage service endpoint enabled), the only network allowed to the storage account."
  type        = string
}

variable "namespace" {
  description = "Kubernetes namespace of the release (created if absent)."
  type        = string
  default     = "cornus"
}

variable "image_repository" {
  description = "Where you pushed the image built from the repository's Dockerfile, e.g. myregistry.azurecr.io/cornus."
  type        = string
}

variable "image_digest" {
  description = "The image's sha256:... digest, which pins exactly what runs."
  type        = string
}

variable "replica_count" {
  description = "Cornus nodes."
  type        = number
  default     = 3
}

variable "partition_count" {
  description = "Partitions, fixed for the life of the release."
  type        = number
  default     = 12
}
